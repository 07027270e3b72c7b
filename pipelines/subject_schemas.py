"""One registry subject's schemas as a pipeline's decoders read them (Danube's schema registry in
etcd, spec §5.6).

A subject's metadata (`/schemas/{subject}/metadata`) names its schema id and latest version;
each version's definition is at `/schemas/{subject}/versions/{n}`. Versions never change once
registered, so they are cached; the metadata is re-read on every `latest_version()` call, which
is how a version registered while a query runs reaches the next micro-batch without a restart.
Registering versions, and the registry's read-modify-writes, are `danube_core.schema_registry`
(shared with the broker's gRPC service); this module is the read side a pipeline holds for its
subject.
"""

from __future__ import annotations

import logging

from danube_core.errors import ConfigError
from danube_core.metadata import MetadataStore
from danube_core.schema_records import SchemaMetadata, SchemaVersion
from danube_core.schema_registry import SchemaNotFoundError, SchemaRegistry

logger = logging.getLogger(__name__)


class SubjectSchemas:
    """Read-only view of one registry subject (driver side; one etcd read per new version)."""

    def __init__(self, metadata: MetadataStore, subject: str) -> None:
        self.registry = SchemaRegistry(metadata)
        self.subject = subject
        self._versions: dict[int, SchemaVersion] = {}

    def subject_metadata(self) -> SchemaMetadata:
        try:
            return self.registry.subject(self.subject)
        except SchemaNotFoundError as exc:
            raise ConfigError(f"{exc}; register the schema first or fix decode.subject") from exc

    def schema_id(self) -> int:
        return self.subject_metadata().id

    def latest_version(self) -> int:
        return self.subject_metadata().latest_version

    def known_versions(self) -> set[int]:
        """The subject's registered version numbers, read now, and any loaded earlier."""
        return {v.version for v in self.subject_metadata().versions} | set(self._versions)

    def loaded_versions(self) -> set[int]:
        """The version numbers loaded so far (no etcd read)."""
        return set(self._versions)

    def version(self, number: int) -> SchemaVersion:
        """Version `number` of the subject; SchemaNotFoundError naming the key if it is missing."""
        if number not in self._versions:
            self._versions[number] = self.registry.version(self.subject, number)[1]
            logger.info("loaded schema %s version %d (%s)", self.subject, number,
                        self._versions[number].schema_def.kind)
        return self._versions[number]
