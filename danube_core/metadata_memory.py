"""In-process `MetadataStore` with etcd's semantics, for unit tests and the `memory` backend.

Sorted range reads, transactions, leases that expire on a background thread (so watchers see
the deletes), asynchronous watches dispatched in order, revisions with a bounded history (reads
at past revisions, watches from a revision, compaction) and fault injection for watch streams.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Literal, Sequence

from danube_core.errors import MetadataCompactedError, MetadataError, MetadataUnavailableError
from danube_core.metadata import (
    EventDispatcher, KeyValues, Lease, LostCallback, MetadataStore, RangeRead, WatchCallback,
    WatchEvent, WatchHandle, check_limit, check_prefix, check_ttl, check_value,
)

logger = logging.getLogger(__name__)

DEFAULT_HISTORY_EVENTS = 100_000  # older revisions are compacted away, as etcd's auto-compaction does


@dataclass(frozen=True)
class _Change:
    event: WatchEvent
    previous: bytes | None  # the value before the change, to read at past revisions


@dataclass(eq=False)
class _Watch:
    handle: WatchHandle
    on_lost: LostCallback | None


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
    watchers, as etcd does. Every write operation is one revision (a `delete_prefix` or a
    lease expiry deleting several keys too); the last `history_events` changes are kept for
    `range_at` past revisions and watches from a revision. Used by unit tests and the
    single-process `memory` backend.
    """

    def __init__(self, *, history_events: int = DEFAULT_HISTORY_EVENTS) -> None:
        self._cond = threading.Condition(threading.RLock())
        self._data: dict[str, tuple[bytes, int]] = {}  # key -> (value, lease id or 0)
        self._leases: dict[int, tuple[int, float]] = {}  # lease id -> (ttl_s, deadline)
        self._lease_ids = itertools.count(0x1000)
        self._revision = 1  # etcd's first revision; each write operation adds one
        self._compacted = 1  # revisions below this one are gone
        self._history: collections.deque[_Change] = collections.deque()
        self._history_events = history_events
        self._watches: list[_Watch] = []
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

    def _next_revision(self) -> int:
        """Under the lock, before a write operation's first change: its revision."""
        self._revision += 1
        return self._revision

    def _emit(self, kind: Literal["put", "delete"], key: str, value: bytes | None,
              previous: bytes | None, revision: int) -> None:
        event = WatchEvent(kind, key, value, revision)
        self._history.append(_Change(event, previous))
        if len(self._history) > self._history_events:
            self._compact_below(self._history[0].event.revision + 1)
        for watch in self._watches:
            if key.startswith(watch.handle.prefix):
                self._dispatcher.submit(watch.handle, [event])

    def _set(self, key: str, value: bytes, lease: Lease | None, revision: int) -> None:
        lease_id = lease.id if lease is not None else 0
        previous = self._data.get(key)
        self._data[key] = (value, lease_id)
        self._emit("put", key, value, previous[0] if previous else None, revision)

    def _check_put(self, key: str, value: bytes, lease: Lease | None) -> None:
        check_value(key, value)
        lease_id = lease.id if lease is not None else 0
        if lease_id and lease_id not in self._leases:
            raise MetadataError(f"put of key {key!r}: lease {lease_id:x} not found (expired or revoked)")

    def _remove(self, key: str, revision: int) -> bool:
        previous = self._data.pop(key, None)
        if previous is None:
            return False
        self._emit("delete", key, None, previous[0], revision)
        return True

    def get(self, key: str) -> bytes | None:
        with self._cond:
            self._live()
            entry = self._data.get(key)
            return entry[0] if entry is not None else None

    def put(self, key: str, value: bytes, lease: Lease | None = None) -> int:
        with self._cond:
            self._live()
            self._check_put(key, value, lease)
            revision = self._next_revision()
            self._set(key, value, lease, revision)
            return revision

    def delete(self, key: str) -> bool:
        with self._cond:
            self._live()
            if key not in self._data:
                return False  # etcd does not bump the revision for a delete of nothing
            return self._remove(key, self._next_revision())

    def delete_prefix(self, prefix: str) -> int:
        check_prefix(prefix)
        with self._cond:
            self._live()
            doomed = sorted(k for k in self._data if k.startswith(prefix))
            if not doomed:
                return 0
            revision = self._next_revision()
            return sum(self._remove(key, revision) for key in doomed)

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
            self._check_put(key, value, lease)
            if key in self._data:
                return False
            self._set(key, value, lease, self._next_revision())
            return True

    def compare_and_put_revision(self, key: str, expected: bytes | None, value: bytes) -> int | None:
        with self._cond:
            self._live()
            check_value(key, value)
            entry = self._data.get(key)
            if (entry[0] if entry is not None else None) != expected:
                return None
            revision = self._next_revision()
            self._set(key, value, None, revision)
            return revision

    def compare_and_put_with(self, key: str, expected: bytes | None, value: bytes,
                             also: Sequence[tuple[str, bytes]]) -> bool:
        with self._cond:
            self._live()
            for checked, checked_value in ((key, value), *also):
                check_value(checked, checked_value)
            entry = self._data.get(key)
            if (entry[0] if entry is not None else None) != expected:
                return False
            revision = self._next_revision()
            for written, written_value in ((key, value), *also):
                self._set(written, written_value, None, revision)
            return True

    def guarded_put(self, key: str, expected: bytes | None, value: bytes, *, guard: tuple[str, bytes | None],
                    lease: Lease | None = None) -> int | None:
        with self._cond:
            self._live()
            check_value(key, value)
            entry, held = self._data.get(key), self._data.get(guard[0])
            if (entry[0] if entry is not None else None) != expected or (held[0] if held else None) != guard[1]:
                return None
            self._check_put(key, value, lease)
            revision = self._next_revision()
            self._set(key, value, lease, revision)
            return revision

    def range_at(self, start_key: str, end_key: str, revision: int | None = None) -> RangeRead:
        with self._cond:
            self._live()
            if revision is None or revision == self._revision:
                keys = sorted(k for k in self._data if start_key <= k < end_key)
                return RangeRead([(k, self._data[k][0]) for k in keys], self._revision)
            if revision > self._revision:
                raise MetadataError(f"range read at revision {revision}: the store is at {self._revision}")
            if revision < self._compacted:
                raise MetadataCompactedError(
                    f"range read of [{start_key!r}, {end_key!r}) at revision {revision}: compacted "
                    f"(oldest available {self._compacted})", self._compacted)
            view = {k: v for k, (v, _) in self._data.items() if start_key <= k < end_key}
            for change in reversed(self._history):  # undo the changes made after `revision`
                if change.event.revision <= revision:
                    break
                if start_key <= change.event.key < end_key:
                    if change.previous is None:
                        view.pop(change.event.key, None)
                    else:
                        view[change.event.key] = change.previous
            return RangeRead(sorted(view.items()), revision)

    def current_revision(self) -> int:
        with self._cond:
            self._live()
            return self._revision

    def compact(self, revision: int) -> None:
        with self._cond:
            self._live()
            if revision > self._revision:
                raise MetadataError(f"compact to revision {revision}: the store is at {self._revision}")
            self._compact_below(revision)

    def _compact_below(self, revision: int) -> None:
        while self._history and self._history[0].event.revision < revision:
            self._history.popleft()
        self._compacted = max(self._compacted, revision)

    def interrupt_watches(self) -> int:
        """Fault injection: break every watch stream, as an etcd restart would.

        Watches with `on_lost` stop and are told (MetadataUnavailableError); the others resume
        after their last event, which in process means they go on unaffected. Returns how many
        watches were told.
        """
        with self._cond:
            lost = [w for w in self._watches if w.on_lost is not None]
            for watch in lost:
                assert watch.on_lost is not None
                self._watches.remove(watch)
                error = MetadataUnavailableError(f"watch on {watch.handle.prefix!r}: stream interrupted")
                self._dispatcher.submit_lost(watch.handle, watch.on_lost, error)
            return len(lost)

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

    def _lease_handle(self, lease_id: int, ttl_s: int) -> Lease:
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
            doomed = sorted(k for k, (_, owner) in self._data.items() if owner == lease_id)
            if doomed:
                revision = self._next_revision()
                for key in doomed:
                    self._remove(key, revision)

    def watch_prefix(
        self, prefix: str, callback: WatchCallback, *, start_revision: int | None = None,
        on_lost: LostCallback | None = None,
    ) -> WatchHandle:
        check_prefix(prefix)
        with self._cond:
            self._live()
            if start_revision is not None and start_revision < self._compacted:
                raise MetadataCompactedError(
                    f"watch on {prefix!r} from revision {start_revision}: compacted "
                    f"(oldest available {self._compacted})", self._compacted)
            handle = WatchHandle(prefix, callback, lambda: self._unwatch(handle))
            if start_revision is not None:
                replay = [c.event for c in self._history
                          if c.event.revision >= start_revision and c.event.key.startswith(prefix)]
                self._dispatcher.submit(handle, replay)
            self._watches.append(_Watch(handle, on_lost))
            return handle

    def _unwatch(self, handle: WatchHandle) -> None:
        with self._cond:
            self._watches = [w for w in self._watches if w.handle is not handle]

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._dispatcher.close()

