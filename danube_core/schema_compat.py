"""Whether a new version of a registry subject may follow the latest one (modes none/backward/forward/full).

Danube's registry refuses a new version that breaks the subject's compatibility mode. The same
rule for JSON Schema and Avro records, applied to top-level fields: a reader can read data
written with another schema when every field the reader requires (JSON Schema `required`, an
Avro field without `default`) exists in the writer's schema, and every field both have keeps
its type. `backward`: the new schema reads the old data; `forward`: the old schema reads the
new data; `full`: both. Schemas that are not object/record schemas must stay the same type.
Protobuf definitions are not parsed here, so only an identical `.proto` counts as compatible.
"""

from __future__ import annotations

import json
from typing import Any

from danube_core.schema_records import SIMPLE_SCHEMA_TYPES, SchemaDef

MODES = ("none", "backward", "forward", "full")

# field name -> (type as canonical JSON text, required)
Fields = dict[str, tuple[str, bool]]


def incompatibilities(mode: str, old: SchemaDef, new: SchemaDef) -> list[str]:
    """Why `new` may not follow `old` under `mode` (empty: it may)."""
    mode = mode.lower()
    if mode not in MODES:
        raise ValueError(f"compatibility mode {mode!r}: expected one of {', '.join(MODES)}")
    if mode == "none":
        return []
    if old.kind != new.kind:
        return [f"schema type changed from {old.kind} to {new.kind}"]
    if old.kind in SIMPLE_SCHEMA_TYPES:
        return []
    if old.kind == "Protobuf":
        if old.fingerprint == new.fingerprint:
            return []
        return ["Protobuf compatibility is not checked here; set the subject's compatibility mode to none "
                "to register a changed .proto"]
    old_fields, new_fields = _fields(old), _fields(new)
    if old_fields is None or new_fields is None:
        if _shape(old) == _shape(new):
            return []
        return [f"the schema's top-level type changed from {_shape(old)} to {_shape(new)}"]
    errors = [f"field {name!r} changed type from {old_fields[name][0]} to {new_fields[name][0]}"
              for name in sorted(old_fields.keys() & new_fields.keys()) if old_fields[name][0] != new_fields[name][0]]
    if mode in ("backward", "full"):
        errors += _missing(new_fields, old_fields, "the new schema", "the previous version")
    if mode in ("forward", "full"):
        errors += _missing(old_fields, new_fields, "the previous version", "the new schema")
    return errors


def _missing(reader: Fields, writer: Fields, reader_name: str, writer_name: str) -> list[str]:
    """Fields the reader requires that data written with the writer's schema lacks."""
    return [f"field {name!r} is required by {reader_name} but missing from {writer_name}"
            for name, (_, required) in sorted(reader.items()) if required and name not in writer]


def _fields(schema: SchemaDef) -> Fields | None:
    """Top-level fields of a JSON Schema object or an Avro record; None for other shapes."""
    parsed = json.loads(schema.raw_schema or "null")
    if not isinstance(parsed, dict):
        return None
    if schema.kind == "JsonSchema":
        properties = parsed.get("properties")
        if not isinstance(properties, dict):
            return None
        required = set(parsed.get("required") or ())
        return {name: (_canonical(spec.get("type") if isinstance(spec, dict) else spec), name in required)
                for name, spec in properties.items()}
    if parsed.get("type") != "record":
        return None
    return {f["name"]: (_canonical(f.get("type")), "default" not in f)
            for f in parsed.get("fields", []) if isinstance(f, dict) and "name" in f}


def _shape(schema: SchemaDef) -> str:
    parsed = json.loads(schema.raw_schema or "null")
    return _canonical(parsed.get("type") if isinstance(parsed, dict) else parsed)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
