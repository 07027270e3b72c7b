"""Danube's schema registry over etcd (spec §5.6): register, look up, list, delete versions, set modes.

The broker's `SchemaRegistry` gRPC service (which the demo uses), the benchmarks and the tests
write subjects through this module, so the keys and JSON the real broker writes are produced
in one place. A new subject takes `/schemas/_global/next_schema_id` (created as 1) and gets an
index entry; each version is `/schemas/{subject}/versions/{n}` and the subject's metadata
lists them. Registering a schema whose fingerprint a version already has returns that
version; a changed schema must pass the subject's compatibility mode
(`danube_core.schema_compat`; Danube's default is Backward).

Fingerprints: `sha256:` of the compact, key-sorted JSON form for JSON Schema and Avro (Danube's
for JSON Schema; for Avro Danube re-serialises through apache-avro, whose field order this does
not reproduce), of the `.proto` text for Protobuf, the type name for the simple types.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from typing import Any, Callable

from danube_core.errors import DanubeError
from danube_core.keys import (
    NEXT_SCHEMA_ID_KEY, schema_compatibility_key, schema_index_key, schema_metadata_key, schema_version_key,
)
from danube_core.metadata import MetadataStore
from danube_core.records import dump_u64, parse_u64
from danube_core.schema_compat import MODES, incompatibilities
from danube_core.schema_records import (
    SIMPLE_SCHEMA_TYPES, SchemaCompatibility, SchemaDef, SchemaIndexEntry, SchemaMetadata, SchemaVersion,
    json_schema_fingerprint,
)

logger = logging.getLogger(__name__)

# What clients call the schema types (danube-client's SchemaType values) -> schema_def kinds.
CLIENT_TYPE_NAMES = {
    "bytes": "Bytes", "string": "String", "number": "Number", "avro": "Avro",
    "json_schema": "JsonSchema", "jsonschema": "JsonSchema", "protobuf": "Protobuf", "proto": "Protobuf",
}
KIND_CLIENT_NAMES = {"Bytes": "bytes", "String": "string", "Number": "number", "Avro": "avro",
                     "JsonSchema": "json_schema", "Protobuf": "protobuf"}


class SchemaNotFoundError(DanubeError):
    """An unknown subject, schema id or version."""


class InvalidSchemaError(DanubeError, ValueError):
    """A schema type or definition that cannot be registered (names what was expected)."""


class IncompatibleSchemaError(DanubeError):
    """A new version that breaks the subject's compatibility mode; lists every reason."""


@dataclasses.dataclass(frozen=True)
class Registration:
    schema_id: int
    version: int
    is_new_version: bool
    fingerprint: str


def schema_def(type_name: str, definition: str) -> SchemaDef:
    """A `schema_def` from a client's type name and definition text, checked and fingerprinted."""
    kind = CLIENT_TYPE_NAMES.get(type_name.lower()) or (type_name if type_name in KIND_CLIENT_NAMES else None)
    if kind is None:
        accepted = ", ".join(sorted(KIND_CLIENT_NAMES.values()))
        raise InvalidSchemaError(f"schema_type {type_name!r}: expected one of {accepted}")
    if kind in SIMPLE_SCHEMA_TYPES:
        return SchemaDef(kind)
    if not definition.strip():
        raise InvalidSchemaError(f"a {kind} schema needs a schema_definition; none was given")
    if kind == "Protobuf":
        return SchemaDef(kind, definition, "sha256:" + hashlib.sha256(definition.encode()).hexdigest())
    try:
        fingerprint = json_schema_fingerprint(definition)
    except ValueError as exc:
        raise InvalidSchemaError(f"the {kind} schema_definition is not valid JSON: {exc}") from exc
    _check_shape(kind, json.loads(definition))
    return SchemaDef(kind, definition, fingerprint)


def _check_shape(kind: str, parsed: Any) -> None:
    """The parts compatibility checks read must have the types JSON Schema / Avro give them."""
    if not isinstance(parsed, dict):
        return
    if kind == "JsonSchema":
        if not isinstance(parsed.get("properties", {}), dict):
            raise InvalidSchemaError("the JsonSchema's \"properties\" must be an object")
        required = parsed.get("required", [])
        if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
            raise InvalidSchemaError("the JsonSchema's \"required\" must be an array of field names")
    elif parsed.get("type") == "record":
        fields = parsed.get("fields")
        if not isinstance(fields, list) or not all(isinstance(f, dict) and isinstance(f.get("name"), str)
                                                   for f in fields):
            raise InvalidSchemaError("the Avro record's \"fields\" must be an array of objects with a string \"name\"")


def fingerprint_of(definition: SchemaDef) -> str:
    return definition.fingerprint or SIMPLE_SCHEMA_TYPES[definition.kind]


class SchemaRegistry:
    """The registry's subjects, versions and ids in one metadata store."""

    def __init__(self, metadata: MetadataStore) -> None:
        self.metadata = metadata

    def subject(self, subject: str) -> SchemaMetadata:
        key = schema_metadata_key(subject)
        raw = self.metadata.get(key)
        if raw is None:
            raise SchemaNotFoundError(f"schema registry subject {subject!r} does not exist (etcd key {key!r})")
        return SchemaMetadata.from_json(raw, key)

    def version(self, subject: str, number: int | None = None) -> tuple[SchemaMetadata, SchemaVersion]:
        """A subject's metadata and its version `number` (its latest when None).

        The metadata's own copy of the version is used: it is written first (by compare-and-put)
        and `/versions/{n}` right after, so a version just registered is found either way.
        """
        meta = self.subject(subject)
        number = meta.latest_version if number is None else number
        listed = next((v for v in meta.versions if v.version == number), None)
        if listed is not None:
            return meta, listed
        key = schema_version_key(subject, number)
        raw = self.metadata.get(key)
        if raw is None:
            raise SchemaNotFoundError(f"schema registry subject {subject!r} has no version {number} (etcd key {key!r})")
        return meta, SchemaVersion.from_json(raw, key)

    def subject_of(self, schema_id: int) -> str:
        key = schema_index_key(schema_id)
        raw = self.metadata.get(key)
        if raw is None:
            raise SchemaNotFoundError(f"schema id {schema_id} is not registered (etcd key {key!r})")
        return SchemaIndexEntry.from_json(raw, key).subject

    def mode(self, subject: str) -> str:
        """The subject's compatibility mode, lowercase (`/compatibility` wins over the metadata)."""
        key = schema_compatibility_key(subject)
        raw = self.metadata.get(key)
        if raw is not None:
            return SchemaCompatibility.from_json(raw, key).mode
        return self.subject(subject).compatibility_mode.lower()

    def check(self, subject: str, definition: SchemaDef, mode: str | None = None) -> list[str]:
        """Why `definition` may not become the subject's next version (empty: it may)."""
        _, latest = self.version(subject)
        return incompatibilities(mode or self.mode(subject), latest.schema_def, definition)

    def register(self, subject: str, definition: SchemaDef, *, created_by: str = "danube-spark",
                 description: str = "", tags: list[str] | None = None) -> Registration:
        """Add `definition` to `subject` (creating it), or return the version that has it already.

        The subject's metadata is the commit point: it is replaced by compare-and-put, so of two
        concurrent registrations one gets the next number and the other tries again after it.
        Only the winner then writes `/versions/{n}` (and, for a new subject, the id index); an
        id taken by a loser for a new subject stays unused.
        """
        if not subject:
            raise InvalidSchemaError("subject must not be empty")
        fingerprint = fingerprint_of(definition)
        key = schema_metadata_key(subject)
        while True:
            raw = self.metadata.get(key)
            now = int(time.time())
            if raw is None:
                current = None
                number = 1
            else:
                current = SchemaMetadata.from_json(raw, key)
                same = next((v for v in current.versions if v.fingerprint == fingerprint), None)
                if same is not None:
                    return Registration(current.id, same.version, False, fingerprint)
                errors = self.check(subject, definition)
                if errors:
                    raise IncompatibleSchemaError(
                        f"schema for subject {subject!r} is not {self.mode(subject)}-compatible with version "
                        f"{current.latest_version}: " + "; ".join(errors))
                number = current.latest_version + 1
            version = SchemaVersion(number, definition, fingerprint, now, created_by, description,
                                    tags=list(tags or []))
            if current is None:
                current = SchemaMetadata(self._next_schema_id(), subject, 0, now, now, created_by)
            updated = dataclasses.replace(current, latest_version=number, updated_at=now,
                                          versions=[*current.versions, version])
            if not self.metadata.compare_and_put(key, raw, updated.to_json()):
                continue  # another registration or change came first: look again
            self.metadata.put(schema_version_key(subject, number), version.to_json())
            if raw is None:
                self.metadata.put(schema_index_key(updated.id), SchemaIndexEntry(updated.id, subject).to_json())
            logger.info("registered %s schema %s version %d (id %d)", definition.kind, subject, number, updated.id)
            return Registration(updated.id, number, True, fingerprint)

    def set_mode(self, subject: str, mode: str) -> None:
        mode = mode.lower()
        if mode not in MODES:
            raise InvalidSchemaError(f"compatibility_mode {mode!r}: expected one of {', '.join(MODES)}")
        self._update(subject, lambda meta: dataclasses.replace(
            meta, compatibility_mode=mode.capitalize(), updated_at=int(time.time())))
        self.metadata.put(schema_compatibility_key(subject), SchemaCompatibility(mode).to_json())

    def delete_version(self, subject: str, number: int) -> None:
        """Remove an older version. The latest cannot go: a number must never name two schemas,
        and messages already carry (schema id, version) pairs readers cache for good."""
        def without(meta: SchemaMetadata) -> SchemaMetadata:
            if number == meta.latest_version:
                raise IncompatibleSchemaError(f"version {number} is the latest version of subject {subject!r}; "
                                              "only older versions can be deleted")
            if not any(v.version == number for v in meta.versions):
                raise SchemaNotFoundError(f"schema registry subject {subject!r} has no version {number}")
            return dataclasses.replace(meta, versions=[v for v in meta.versions if v.version != number],
                                       updated_at=int(time.time()))

        self._update(subject, without)
        self.metadata.delete(schema_version_key(subject, number))

    def _update(self, subject: str, change: Callable[[SchemaMetadata], SchemaMetadata]) -> None:
        """Replace the subject's metadata with `change(current)`, by compare-and-put (retried)."""
        key = schema_metadata_key(subject)
        while True:
            raw = self.metadata.get(key)
            if raw is None:
                raise SchemaNotFoundError(f"schema registry subject {subject!r} does not exist (etcd key {key!r})")
            if self.metadata.compare_and_put(key, raw, change(SchemaMetadata.from_json(raw, key)).to_json()):
                return

    def _next_schema_id(self) -> int:
        """Take the global counter's value and bump it (atomically, unlike the broker's get-then-put)."""
        while True:
            raw = self.metadata.get(NEXT_SCHEMA_ID_KEY)
            current = 1 if raw is None else parse_u64(raw, NEXT_SCHEMA_ID_KEY)
            if self.metadata.compare_and_put(NEXT_SCHEMA_ID_KEY, raw, dump_u64(current + 1)):
                return current


def register_schema(metadata: MetadataStore, subject: str, kind: str, raw_schema: str, *,
                    created_by: str = "danube-spark", description: str = "") -> tuple[int, int]:
    """Register a `kind` (JsonSchema, Avro, ...) schema text under `subject`; returns (schema_id, version)."""
    found = SchemaRegistry(metadata).register(subject, schema_def(kind, raw_schema), created_by=created_by,
                                              description=description)
    return found.schema_id, found.version
