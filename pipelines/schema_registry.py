"""Danube's schema registry in etcd (spec §5.6): reading payload schemas, registering versions.

A subject's metadata (`/schemas/{subject}/metadata`) names its schema id and latest version;
each version's definition is at `/schemas/{subject}/versions/{n}`. Versions never change once
registered, so they are cached; the metadata is re-read on every `latest_version()` call, which
is how a version registered while a query runs reaches the next micro-batch without a restart.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from danube_core.errors import ConfigError, MetadataError
from danube_core.keys import NEXT_SCHEMA_ID_KEY, schema_index_key, schema_metadata_key, schema_version_key
from danube_core.metadata import MetadataStore
from danube_core.records import dump_u64, parse_u64
from danube_core.schema_records import (
    SchemaDef, SchemaIndexEntry, SchemaMetadata, SchemaVersion, json_schema_fingerprint,
)

logger = logging.getLogger(__name__)


class SubjectSchemas:
    """Read-only view of one registry subject (driver side; one etcd read per new version)."""

    def __init__(self, metadata: MetadataStore, subject: str) -> None:
        self.metadata = metadata
        self.subject = subject
        self._versions: dict[int, SchemaVersion] = {}

    def subject_metadata(self) -> SchemaMetadata:
        key = schema_metadata_key(self.subject)
        raw = self.metadata.get(key)
        if raw is None:
            raise ConfigError(
                f"schema registry subject {self.subject!r} does not exist (etcd key {key!r} is missing); "
                "register the schema first or fix decode.subject"
            )
        return SchemaMetadata.from_json(raw, key)

    def schema_id(self) -> int:
        return self.subject_metadata().id

    def latest_version(self) -> int:
        return self.subject_metadata().latest_version

    def version(self, number: int) -> SchemaVersion:
        """Version `number` of the subject; MetadataError naming the key if it is missing."""
        if number not in self._versions:
            key = schema_version_key(self.subject, number)
            raw = self.metadata.get(key)
            if raw is None:
                raise MetadataError(
                    f"schema registry: subject {self.subject!r} has no version {number} (etcd key {key!r})"
                )
            self._versions[number] = SchemaVersion.from_json(raw, key)
            logger.info("loaded schema %s version %d (%s)", self.subject, number,
                        self._versions[number].schema_def.kind)
        return self._versions[number]


def register_schema(metadata: MetadataStore, subject: str, kind: str, raw_schema: str, *,
                    created_by: str = "danube-spark", description: str = "") -> tuple[int, int]:
    """Add a JsonSchema or Avro version to `subject` (creating it); returns (schema_id, version).

    Follows §5.6: a new subject takes `/schemas/_global/next_schema_id` (created as 1) and
    bumps it, gets an index entry, version 1 and its metadata; an existing subject gets
    version latest + 1 and updated metadata. No compatibility check is made here. Fingerprint:
    sha256 of the compact, key-sorted JSON form (Danube's for JSON Schema; for Avro Danube
    re-serialises through apache-avro, whose field order this does not reproduce).
    """
    if kind not in ("JsonSchema", "Avro"):
        raise ValueError(f"register_schema kind={kind!r}: expected 'JsonSchema' or 'Avro'")
    now = int(time.time())
    fingerprint = json_schema_fingerprint(raw_schema)
    key = schema_metadata_key(subject)
    raw = metadata.get(key)
    if raw is None:
        schema_id = _next_schema_id(metadata)
        metadata.put(schema_index_key(schema_id), SchemaIndexEntry(schema_id, subject).to_json())
        current = SchemaMetadata(schema_id, subject, 0, now, now, created_by)
    else:
        current = SchemaMetadata.from_json(raw, key)
    number = current.latest_version + 1
    version = SchemaVersion(number, SchemaDef(kind, raw_schema, fingerprint), fingerprint, now, created_by, description)
    metadata.put(schema_version_key(subject, number), version.to_json())
    updated = dataclasses.replace(current, latest_version=number, updated_at=now, versions=[*current.versions, version])
    metadata.put(key, updated.to_json())
    logger.info("registered %s schema %s version %d (id %d)", kind, subject, number, updated.id)
    return updated.id, number


def _next_schema_id(metadata: MetadataStore) -> int:
    """Take the global counter's value and bump it (atomically, unlike the broker's get-then-put)."""
    while True:
        raw = metadata.get(NEXT_SCHEMA_ID_KEY)
        current = 1 if raw is None else parse_u64(raw, NEXT_SCHEMA_ID_KEY)
        if metadata.compare_and_put(NEXT_SCHEMA_ID_KEY, raw, dump_u64(current + 1)):
            return current
