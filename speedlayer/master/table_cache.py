"""The master's Delta source: a table version resolved once, then served from memory.

A Delta version never changes once committed, so what it resolves to (files, schema, commit
time) can be kept by (table URI, version, partitions asked for). Admission asks for a table's
latest version: that is found by bringing one cached log handle up to date
(`DeltaTableSource.latest_version`: only the commits after the last one it saw), and only a
version not seen before is opened and read whole. At 2,000 datasets admitted over one table,
every admission after the first read only the log's new commits, not the whole log, the
commit history and the add actions again.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

from speedlayer.sources import PartitionFilter, ResolvedTable
from speedlayer.sources.delta import DeltaTableSource

CACHED_VERSIONS = 32  # resolved (table, version, partitions) kept, least recently used dropped first


class VersionCachedDeltaSource(DeltaTableSource):
    """`DeltaTableSource` whose `resolve_uri` keeps the last `CACHED_VERSIONS` results."""

    def __init__(self, storage_options: dict[str, str] | None = None, capacity: int = CACHED_VERSIONS) -> None:
        super().__init__(storage_options)
        self._capacity = capacity
        self._resolved: OrderedDict[tuple[str, int, str], ResolvedTable] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._log_locks: dict[str, threading.Lock] = {}  # table URI -> held while its log handle updates

    def latest_version(self, table_uri: str) -> int:
        """As `DeltaTableSource.latest_version`, one caller per table at a time: admissions
        (any gRPC thread) and the refresher share the table's one cached log handle."""
        with self._cache_lock:
            lock = self._log_locks.setdefault(table_uri, threading.Lock())
        with lock:
            return super().latest_version(table_uri)

    def resolve_uri(self, table_uri: str, version: int | None, partitions: PartitionFilter) -> ResolvedTable:
        if version is None:
            version = self.latest_version(table_uri)
        key = (table_uri, version, json.dumps(partitions, sort_keys=True))
        with self._cache_lock:
            resolved = self._resolved.get(key)
            if resolved is not None:
                self._resolved.move_to_end(key)
                return resolved
        resolved = super().resolve_uri(table_uri, version, partitions)  # raises for what cannot be loaded
        with self._cache_lock:
            self._resolved[key] = resolved
            while len(self._resolved) > self._capacity:
                self._resolved.popitem(last=False)
        return resolved
