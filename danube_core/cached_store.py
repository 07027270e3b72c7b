"""A `MetadataStore` that writes to etcd and reads from a `LocalCache`, reading its own writes.

The seeds' pattern as one object a component can be handed instead of the store: Put/Delete go
to etcd; Get is served from the cache when the key is under the cache's prefixes (from etcd
otherwise). Before a cached read, the cache must have applied every write made through this
object (read-your-writes, process-wide): a write's revision is what `put` /
`compare_and_put_revision` return, or etcd's current revision after a delete or a
create-if-absent. If the cache cannot get there within `wait_s` (its watch is down), the read
goes to etcd: slower, never older than our own writes. A compare-and-put that fails, or a
create-if-absent, means the caller's view may be old: later reads wait for etcd's current
revision, so read-compare-write loops converge.

Writes by *other* processes become visible when the cache's watch delivers them (milliseconds),
as in Danube: hand this object only to code for which such a read is safe. A watch under the
cache's prefixes is a subscription to the cache: its callback runs once the cache has applied
the change, so what the callback (or work it schedules) reads is at least that new. After a
lost etcd watch the cache re-lists, and such a watch sees the net changes of the gap.
Watch callbacks run on the thread that applies the cache's events, so they should hand work
off (as the broker's do) rather than read here after a write: that read would wait for an event
the same thread has yet to apply, and fall back to etcd after `wait_s`.
"""

from __future__ import annotations

import logging
import threading

from danube_core.errors import StaleCacheError
from danube_core.local_cache import LocalCache
from danube_core.metadata import (
    KeyValues, Lease, LostCallback, MetadataStore, RangeRead, WatchCallback, WatchHandle, prefix_end,
)

logger = logging.getLogger(__name__)

DEFAULT_WAIT_S = 5.0


class CachedMetadataStore(MetadataStore):
    """Writes to `store`, reads from `cache` (see the module docstring). Closing it closes the
    cache, not the store (which others may share)."""

    def __init__(self, store: MetadataStore, cache: LocalCache, *, wait_s: float = DEFAULT_WAIT_S) -> None:
        self.store = store
        self.cache = cache
        self._wait_s = wait_s
        self._lock = threading.Lock()
        self._written = 0  # highest revision written through this object

    def __repr__(self) -> str:
        return f"CachedMetadataStore({self.store!r}, {self.cache!r})"

    # ---- reads ------------------------------------------------------------------------------

    def _cached(self, start_key: str, end_key: str) -> bool:
        """Whether [start_key, end_key) is the cache's to answer, once it has our writes."""
        if not self.cache.covers(start_key, end_key):
            return False
        with self._lock:
            written = self._written
        if self.cache.revision >= written:
            return True
        try:
            self.cache.wait_for_revision(written, self._wait_s)
            return True
        except StaleCacheError as exc:
            logger.warning("reading from etcd instead: %s", exc)
            return False

    def get(self, key: str) -> bytes | None:
        return self.cache.get(key) if self._cached(key, key + "\0") else self.store.get(key)

    def get_prefix(self, prefix: str, keys_only: bool = False) -> KeyValues:
        if self._cached(prefix, prefix_end(prefix)):
            return self.cache.get_prefix(prefix, keys_only)
        return self.store.get_prefix(prefix, keys_only)

    def get_range(self, start_key: str, end_key: str, limit: int | None = None) -> KeyValues:
        if self._cached(start_key, end_key):
            return self.cache.get_range(start_key, end_key, limit)
        return self.store.get_range(start_key, end_key, limit)

    def range_at(self, start_key: str, end_key: str, revision: int | None = None) -> RangeRead:
        return self.store.range_at(start_key, end_key, revision)

    def current_revision(self) -> int:
        return self.store.current_revision()

    # ---- writes -----------------------------------------------------------------------------

    def wrote(self, revision: int) -> None:
        """Record a write made at `revision`: later cached reads wait for it."""
        with self._lock:
            self._written = max(self._written, revision)

    def _wrote_now(self) -> None:
        """After a write that does not return its revision: etcd's current one covers it."""
        self.wrote(self.store.current_revision())

    def put(self, key: str, value: bytes, lease: Lease | None = None) -> int:
        revision = self.store.put(key, value, lease)
        self.wrote(revision)
        return revision

    def compare_and_put_revision(self, key: str, expected: bytes | None, value: bytes) -> int | None:
        revision = self.store.compare_and_put_revision(key, expected, value)
        if revision is not None:
            self.wrote(revision)
        else:
            self.sync_reads()  # `expected` came from a stale read: the caller's retry reads anew
        return revision

    def guarded_put(self, key: str, expected: bytes | None, value: bytes, *, guard: tuple[str, bytes | None],
                    lease: Lease | None = None) -> int | None:
        revision = self.store.guarded_put(key, expected, value, guard=guard, lease=lease)
        if revision is not None:
            self.wrote(revision)
        else:
            self.sync_reads()
        return revision

    def put_if_absent(self, key: str, value: bytes, lease: Lease | None = None) -> bool:
        created = self.store.put_if_absent(key, value, lease)
        self._wrote_now()  # created, or it exists and later reads must show it
        return created

    def delete(self, key: str) -> bool:
        deleted = self.store.delete(key)
        if deleted:
            self._wrote_now()
        return deleted

    def delete_prefix(self, prefix: str) -> int:
        deleted = self.store.delete_prefix(prefix)
        if deleted:
            self._wrote_now()
        return deleted

    def sync_reads(self) -> None:
        """Later cached reads wait for etcd's revision as of now (one request)."""
        self._wrote_now()

    def compact(self, revision: int) -> None:
        self.store.compact(revision)

    # ---- the rest is the store's ------------------------------------------------------------

    def grant_lease(self, ttl_s: int) -> Lease:
        return self.store.grant_lease(ttl_s)

    def resume_lease(self, lease_id: int, ttl_s: int) -> Lease:
        return self.store.resume_lease(lease_id, ttl_s)

    def revoke_lease(self, lease_id: int) -> None:
        self.store.revoke_lease(lease_id)

    def watch_prefix(
        self, prefix: str, callback: WatchCallback, *, start_revision: int | None = None,
        on_lost: LostCallback | None = None,
    ) -> WatchHandle:
        covered = self.cache.covers(prefix, prefix_end(prefix))
        if covered and start_revision is None and on_lost is None:
            subscription = self.cache.subscribe(prefix, callback)
            return WatchHandle(prefix, callback, subscription.cancel)
        return self.store.watch_prefix(prefix, callback, start_revision=start_revision, on_lost=on_lost)

    def close(self) -> None:
        self.cache.close()
