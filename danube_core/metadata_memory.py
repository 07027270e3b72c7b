"""In-process `MetadataStore` with etcd's semantics, for unit tests and the `memory` backend.

Sorted range reads, transactions, leases that expire on a background thread (so watchers see
the deletes), asynchronous watches dispatched in order.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Literal

from danube_core.errors import MetadataError
from danube_core.metadata import (
    EventDispatcher, KeyValues, Lease, MetadataStore, WatchCallback, WatchEvent, WatchHandle,
    check_limit, check_prefix, check_ttl, check_value,
)

logger = logging.getLogger(__name__)

class _MemoryLease(Lease):
    def __init__(self, store: "MemoryMetadataStore", lease_id: int, ttl_s: int) -> None:
        super().__init__(lease_id, ttl_s)
        self._store = store

    def refresh(self) -> None:
        if not self._store._refresh_lease(self.id):
            raise self._expired()

    def revoke(self) -> None:
        self._store._revoke_lease(self.id)


class MemoryMetadataStore(MetadataStore):
    """An in-process etcd: same ordering, transaction, lease and watch semantics, no server.

    Leases expire on a reaper thread at their deadline, deleting their keys and notifying
    watchers, as etcd does. Used by unit tests and the single-process `memory` backend.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.RLock())
        self._data: dict[str, tuple[bytes, int]] = {}  # key -> (value, lease id or 0)
        self._leases: dict[int, tuple[int, float]] = {}  # lease id -> (ttl_s, deadline)
        self._lease_ids = itertools.count(0x1000)
        self._watches: list[WatchHandle] = []
        self._dispatcher = EventDispatcher("memory-metadata-watch")
        self._reaper: threading.Thread | None = None
        self._closed = False

    def _live(self) -> None:
        """Under the lock: refuse use after close and drop keys of leases past their deadline."""
        if self._closed:
            raise MetadataError("memory metadata store is closed")
        now = time.monotonic()
        for lease_id in [i for i, (_, deadline) in self._leases.items() if deadline <= now]:
            self._drop_lease(lease_id)

    def _emit(self, kind: Literal["put", "delete"], key: str, value: bytes | None) -> None:
        event = WatchEvent(kind, key, value)
        for handle in self._watches:
            if key.startswith(handle.prefix):
                self._dispatcher.submit(handle, [event])

    def _set(self, key: str, value: bytes, lease: Lease | None) -> None:
        check_value(key, value)
        lease_id = lease.id if lease is not None else 0
        if lease_id and lease_id not in self._leases:
            raise MetadataError(f"put of key {key!r}: lease {lease_id:x} not found (expired or revoked)")
        self._data[key] = (value, lease_id)
        self._emit("put", key, value)

    def _remove(self, key: str) -> bool:
        if self._data.pop(key, None) is None:
            return False
        self._emit("delete", key, None)
        return True

    def get(self, key: str) -> bytes | None:
        with self._cond:
            self._live()
            entry = self._data.get(key)
            return entry[0] if entry is not None else None

    def put(self, key: str, value: bytes, lease: Lease | None = None) -> None:
        with self._cond:
            self._live()
            self._set(key, value, lease)

    def delete(self, key: str) -> bool:
        with self._cond:
            self._live()
            return self._remove(key)

    def delete_prefix(self, prefix: str) -> int:
        check_prefix(prefix)
        with self._cond:
            self._live()
            doomed = sorted(k for k in self._data if k.startswith(prefix))
            return sum(self._remove(key) for key in doomed)

    def get_prefix(self, prefix: str, keys_only: bool = False) -> KeyValues:
        check_prefix(prefix)
        with self._cond:
            self._live()
            keys = sorted(k for k in self._data if k.startswith(prefix))
            return [(k, b"" if keys_only else self._data[k][0]) for k in keys]

    def get_range(self, start_key: str, end_key: str, limit: int | None = None) -> KeyValues:
        check_limit(limit)
        with self._cond:
            self._live()
            keys = sorted(k for k in self._data if start_key <= k < end_key)[:limit]
            return [(k, self._data[k][0]) for k in keys]

    def put_if_absent(self, key: str, value: bytes, lease: Lease | None = None) -> bool:
        with self._cond:
            self._live()
            if key in self._data:
                return False
            self._set(key, value, lease)
            return True

    def compare_and_put(self, key: str, expected: bytes | None, value: bytes) -> bool:
        with self._cond:
            self._live()
            entry = self._data.get(key)
            if (entry[0] if entry is not None else None) != expected:
                return False
            self._set(key, value, None)
            return True

    def grant_lease(self, ttl_s: int) -> Lease:
        check_ttl(ttl_s)
        with self._cond:
            self._live()
            lease_id = next(self._lease_ids)
            self._leases[lease_id] = (ttl_s, time.monotonic() + ttl_s)
            if self._reaper is None:
                self._reaper = threading.Thread(target=self._reap, name="memory-leases", daemon=True)
                self._reaper.start()
            self._cond.notify_all()
            return _MemoryLease(self, lease_id, ttl_s)

    def _reap(self) -> None:
        """Expire leases at their deadlines even when nobody calls the store (watchers rely on it)."""
        with self._cond:
            while not self._closed:
                self._live()
                deadlines = [deadline for _, deadline in self._leases.values()]
                self._cond.wait(max(0.0, min(deadlines) - time.monotonic()) if deadlines else None)

    def _refresh_lease(self, lease_id: int) -> bool:
        with self._cond:
            self._live()
            if lease_id not in self._leases:
                return False
            ttl_s, _ = self._leases[lease_id]
            self._leases[lease_id] = (ttl_s, time.monotonic() + ttl_s)
            return True

    def _revoke_lease(self, lease_id: int) -> None:
        with self._cond:
            self._live()
            self._drop_lease(lease_id)

    def _drop_lease(self, lease_id: int) -> None:
        if self._leases.pop(lease_id, None) is not None:
            for key in sorted(k for k, (_, owner) in self._data.items() if owner == lease_id):
                self._remove(key)

    def watch_prefix(self, prefix: str, callback: WatchCallback) -> WatchHandle:
        check_prefix(prefix)
        with self._cond:
            self._live()
            handle = WatchHandle(prefix, callback, lambda: self._unwatch(handle))
            self._watches.append(handle)
            return handle

    def _unwatch(self, handle: WatchHandle) -> None:
        with self._cond:
            if handle in self._watches:
                self._watches.remove(handle)

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._dispatcher.close()

