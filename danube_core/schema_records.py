"""Danube schema-registry values in etcd (spec §5.6): subjects, versions, the id index.

Kept apart from `records.py` (cluster, topic and storage values) because only the schema
registry and the pipelines' decoders use them. Same JSON rules: compact, sorted, exact ints.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from danube_core.errors import MetadataError
from danube_core.records import (
    Converter, JsonRecord, bad_value, boolean, dump_json, expect_object, list_of, nested, one_of,
    optional, string, u32, u64,
)


SIMPLE_SCHEMA_TYPES = {"Bytes": "bytes", "String": "string", "Number": "number"}
PROTOBUF_MESSAGE_NAME = "DefaultMessage"


def json_schema_fingerprint(raw_schema: str) -> str:
    """`sha256:<hex>` of the schema re-serialised as compact sorted JSON (as serde_json does)."""
    canonical = dump_json(json.loads(raw_schema))
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


@dataclass
class SchemaDef(JsonRecord):
    """The externally tagged `schema_def` enum.

    kind: Bytes | String | Number | Avro | JsonSchema | Protobuf. For Protobuf, `raw_schema`
    holds the `.proto` text (`raw_proto` in JSON).
    """

    kind: str
    raw_schema: str | None = None
    fingerprint: str | None = None
    message_name: str | None = None

    def to_value(self) -> Any:
        if self.kind in SIMPLE_SCHEMA_TYPES:
            return self.kind
        if self.kind == "Protobuf":
            body = {"fingerprint": self.fingerprint, "message_name": self.message_name or PROTOBUF_MESSAGE_NAME,
                    "raw_proto": self.raw_schema}
        else:
            body = {"fingerprint": self.fingerprint, "raw_schema": self.raw_schema}
        return {self.kind: body}

    @classmethod
    def from_value(cls, value: Any, key: str) -> "SchemaDef":
        if isinstance(value, str) and value in SIMPLE_SCHEMA_TYPES:
            return cls(value)
        if isinstance(value, dict) and len(value) == 1:
            (kind, body), = value.items()
            body = expect_object(body, key, f"schema_def.{kind}")
            if kind in ("Avro", "JsonSchema"):
                return cls(kind, _field(body, key, "raw_schema", string), _field(body, key, "fingerprint", string))
            if kind == "Protobuf":
                return cls(kind, _field(body, key, "raw_proto", string), _field(body, key, "fingerprint", string),
                           _field(body, key, "message_name", string))
        raise bad_value(key, "schema_def", "Bytes, String, Number or {Avro|JsonSchema|Protobuf: {...}}", value)


def _field(obj: dict, key: str, name: str, convert: Converter) -> Any:
    if name not in obj:
        raise MetadataError(f"etcd key {key!r}: missing required field {name!r}")
    return convert(obj[name], key, name)


@dataclass
class SchemaVersion(JsonRecord):
    """`/schemas/{subject}/versions/{n}`: one registered schema version."""

    version: int
    schema_def: SchemaDef
    fingerprint: str
    created_at: int
    created_by: str
    description: str = ""
    is_deprecated: bool = False
    deprecation_message: str | None = None
    tags: list[str] = field(default_factory=list)

    _fields = {
        "version": u32, "schema_def": nested(SchemaDef), "fingerprint": string, "created_at": u64,
        "created_by": string, "description": string, "is_deprecated": boolean,
        "deprecation_message": optional(string), "tags": list_of(string),
    }


@dataclass
class SchemaMetadata(JsonRecord):
    """`/schemas/{subject}/metadata`; compatibility_mode is capitalised here (default Backward)."""

    id: int
    subject: str
    latest_version: int
    created_at: int
    updated_at: int
    created_by: str
    compatibility_mode: str = "Backward"
    topics_using: list[str] = field(default_factory=list)
    versions: list[SchemaVersion] = field(default_factory=list)

    _fields = {
        "id": u64, "subject": string, "latest_version": u32, "created_at": u64,
        "updated_at": u64, "created_by": string,
        "compatibility_mode": one_of("None", "Backward", "Forward", "Full"),
        "topics_using": list_of(string), "versions": list_of(nested(SchemaVersion)),
    }


@dataclass
class SchemaIndexEntry(JsonRecord):
    """`/schemas/_index/by_id/{id}`."""

    schema_id: int
    subject: str

    _fields = {"schema_id": u64, "subject": string}


@dataclass
class SchemaCompatibility(JsonRecord):
    """`/schemas/{subject}/compatibility`; the mode is lowercase here, unlike the metadata."""

    mode: str

    _fields = {"mode": one_of("none", "backward", "forward", "full")}
