"""The metadata store: etcd's key space behind one small interface (the interface only).

The broker and the connector's driver read and write Danube's etcd keys (spec §5) only through
`MetadataStore`: keys are `str`, values are the exact JSON `bytes` (never re-encoded here, so
u64 ids stay exact). The implementations live in their own modules and import this one, never
the other way round: `danube_core.metadata_etcd.EtcdMetadataStore` talks to a real etcd;
`danube_core.metadata_memory.MemoryMetadataStore` has the same semantics (sorted range reads,
transactions, leases that expire, asynchronous watches) for unit tests and the `memory`
metadata backend. Whoever builds a store imports the one it builds, so a user of the memory
store never loads grpc/pyetcd. Watch callbacks run on one dispatcher thread
per store, in event order, so a callback may call back into the store.

Revisions are etcd's: every write gets the store's next revision (`put` returns it), a
`range_at` read is one consistent snapshot and says which revision it reflects, and a watch may
start at a revision so that "read at R, then watch from R + 1" misses nothing. A watch given
`on_lost` reports a broken stream or a compacted start revision to its owner (who re-reads)
instead of resuming on its own; `danube_core.local_cache.LocalCache` is built on that.

Every etcd/gRPC failure is translated by the etcd store: an unreachable etcd becomes
`MetadataUnavailableError` (retriable; names the endpoints, the operation and the key), anything
else `MetadataError` naming the key. Reads are retried through `danube_core.retry`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, Literal, Sequence

from danube_core.errors import DanubeError, MetadataError

logger = logging.getLogger(__name__)

KeyValues = list[tuple[str, bytes]]


@dataclass(frozen=True)
class WatchEvent:
    """One change under a watched prefix. `value` is None for deletes (incl. lease expiry)."""

    kind: Literal["put", "delete"]
    key: str
    value: bytes | None
    # The store revision of the change (etcd's mod_revision); not part of equality, so an
    # event compares by what changed.
    revision: int = field(default=0, compare=False)


@dataclass(frozen=True)
class RangeRead:
    """The keys of a range read at one store revision (`revision`: the snapshot's revision)."""

    kvs: KeyValues
    revision: int


WatchCallback = Callable[[WatchEvent], None]
LostCallback = Callable[[DanubeError], None]


class WatchHandle:
    """A registered watch. Once cancelled, its callback is not called again.

    (A call already running on the dispatcher thread when `cancel()` is called may finish.)
    """

    def __init__(self, prefix: str, callback: WatchCallback, on_cancel: Callable[[], None]) -> None:
        self.prefix = prefix
        self.callback = callback
        self._on_cancel = on_cancel
        self._cancelled = threading.Event()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        if not self._cancelled.is_set():
            self._cancelled.set()
            self._on_cancel()

    def wait_cancelled(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for a cancel; True if cancelled (used to pace reconnects)."""
        return self._cancelled.wait(timeout_s)


@dataclass(frozen=True)
class _Lost:
    on_lost: LostCallback
    error: DanubeError


class EventDispatcher:
    """Runs watch callbacks on one daemon thread, in the order events were submitted.

    Decouples callbacks from etcd's stream thread (or a store lock), so a callback may itself
    read, write or watch through the store without deadlocking.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._queue: queue.SimpleQueue[tuple[WatchHandle, WatchEvent | _Lost] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, handle: WatchHandle, events: list[WatchEvent]) -> None:
        self._put([(handle, event) for event in events])

    def submit_lost(self, handle: WatchHandle, on_lost: LostCallback, error: DanubeError) -> None:
        """Call `on_lost(error)` after the events already submitted (unless cancelled by then)."""
        self._put([(handle, _Lost(on_lost, error))])

    def _put(self, items: list[tuple[WatchHandle, WatchEvent | _Lost]]) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            for item in items:
                self._queue.put(item)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            handle, event = item
            if handle.cancelled:
                continue
            try:
                if isinstance(event, _Lost):
                    event.on_lost(event.error)
                else:
                    handle.callback(event)
            except Exception:  # a failing callback must not stop other watches' deliveries
                logger.exception("watch callback for prefix %r failed on %s", handle.prefix, event)

    def close(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            if thread is not threading.current_thread():
                thread.join(timeout=5.0)


class KeepAlive:
    """Background refresh of a lease every `interval_s` on a daemon thread; `stop()` ends it.

    Retriable failures (etcd briefly unreachable) are logged and retried at the next tick; if
    the lease turns out to be gone, the thread calls `on_lost(error)` and stops, so the owner
    (e.g. a leader) learns it has lost what the lease protected.
    """

    def __init__(self, lease: "Lease", interval_s: float, on_lost: LostCallback | None) -> None:
        self._lease = lease
        self._interval_s = interval_s
        self._on_lost = on_lost
        # Until when (monotonic) etcd surely still holds the lease: a refresh sent at t restarts
        # its TTL no earlier than t. The lease was just granted or refreshed when this starts.
        self._held_until = time.monotonic() + lease.ttl_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{lease.id:x}", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def held_for_s(self) -> float:
        """Seconds the lease is still surely held (negative: it may have expired; etcd then
        deletes its keys, and whoever watches them acts on it, such as a leader's failover)."""
        return self._held_until - time.monotonic() if self.alive else -1.0

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            sent = time.monotonic()
            try:
                self._lease.refresh()
                self._held_until = sent + self._lease.ttl_s
            except DanubeError as exc:
                if exc.retriable:
                    logger.warning("keep-alive of lease %x failed, retrying: %s", self._lease.id, exc)
                    continue
                logger.error("lease %x lost: %s", self._lease.id, exc)
                if self._on_lost is not None:
                    self._on_lost(exc)
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)


class Lease(ABC):
    """A TTL lease: keys put with it vanish when it expires or is revoked."""

    def __init__(self, lease_id: int, ttl_s: int) -> None:
        self.id = lease_id
        self.ttl_s = ttl_s

    @abstractmethod
    def refresh(self) -> None:
        """Restart the TTL. MetadataError (not retriable) if the lease has already expired."""

    @abstractmethod
    def revoke(self) -> None:
        """End the lease now, deleting its keys. Revoking an expired lease is not an error."""

    def keep_alive(
        self, interval_s: float | None = None, on_lost: LostCallback | None = None
    ) -> KeepAlive:
        """Refresh in the background, by default every third of the TTL."""
        return KeepAlive(self, interval_s if interval_s is not None else self.ttl_s / 3.0, on_lost)

    def release(self, keep_alive: KeepAlive | None, what: str) -> None:
        """Stop `keep_alive` (this lease's, if any), then revoke: `what` (the lease's purpose, for
        the log) ends now. A failed revoke is logged, not raised: the lease expires by itself."""
        if keep_alive is not None:
            keep_alive.stop()
        try:
            self.revoke()
        except DanubeError as exc:
            logger.warning("revoking the lease of %s failed (it expires within %ds): %s", what, self.ttl_s, exc)

    def _expired(self) -> MetadataError:
        return MetadataError(f"lease {self.id:x} (ttl {self.ttl_s}s) has expired; its keys are gone")


class MetadataStore(ABC):
    """Danube's etcd key space. Keys are str, values bytes; ranges are returned sorted by key."""

    @abstractmethod
    def get(self, key: str) -> bytes | None: ...

    @abstractmethod
    def put(self, key: str, value: bytes, lease: Lease | None = None) -> int:
        """Write `value`; returns the store revision of the write (for read-your-writes waits)."""

    @abstractmethod
    def delete(self, key: str) -> bool:
        """True if the key existed."""

    @abstractmethod
    def delete_prefix(self, prefix: str) -> int:
        """Number of keys deleted."""

    @abstractmethod
    def get_prefix(self, prefix: str, keys_only: bool = False) -> KeyValues:
        """All keys starting with `prefix`, sorted; values are b"" when `keys_only`."""

    @abstractmethod
    def get_range(self, start_key: str, end_key: str, limit: int | None = None) -> KeyValues:
        """Keys in [start_key, end_key), sorted, at most `limit` of them.

        Lets a reader start at a zero-padded descriptor key without scanning older ones.
        """

    @abstractmethod
    def put_if_absent(self, key: str, value: bytes, lease: Lease | None = None) -> bool:
        """Atomically create `key`; False (nothing written) if it already exists."""

    def compare_and_put(self, key: str, expected: bytes | None, value: bytes) -> bool:
        """Atomically write `value` if the key holds `expected` (None: the key must be absent)."""
        return self.compare_and_put_revision(key, expected, value) is not None

    @abstractmethod
    def compare_and_put_revision(self, key: str, expected: bytes | None, value: bytes) -> int | None:
        """`compare_and_put` returning the revision written, None if the comparison failed."""

    def compare_and_put_with(self, key: str, expected: bytes | None, value: bytes,
                             also: Sequence[tuple[str, bytes]]) -> bool:
        """`compare_and_put`, writing the `also` keys too (unconditionally) when it swaps, in one
        request and one transaction where the store can (etcd, memory): a writer whose record
        and companion keys each took a round trip (a speed-layer admission: the record, its plan,
        its request id) takes one. Here: the `also` keys first, then the compare-and-put; a
        failed comparison leaves them written, so they must be harmless alone (idempotent)."""
        for other, other_value in also:
            self.put(other, other_value)
        return self.compare_and_put(key, expected, value)

    def guarded_put(self, key: str, expected: bytes | None, value: bytes, *, guard: tuple[str, bytes | None],
                    lease: "Lease | None" = None) -> int | None:
        """`compare_and_put_revision` that also requires the key `guard[0]` to hold `guard[1]`
        (None: to be absent), in one etcd transaction comparing both keys, writing `value` with
        `lease` if given.

        A write that must only happen while some other key says the writer may make it: a
        subscription cursor moved only while its query holds the subscription lock. None if
        either comparison failed (the caller re-reads both to tell which).
        """
        raise NotImplementedError(f"{type(self).__name__} has no guarded_put")

    @abstractmethod
    def range_at(self, start_key: str, end_key: str, revision: int | None = None) -> RangeRead:
        """Every key in [start_key, end_key) as of `revision` (None: now), with that revision.

        One consistent snapshot however large (etcd reads it in pages pinned to one revision).
        MetadataCompactedError if `revision` has been compacted.
        """

    @abstractmethod
    def current_revision(self) -> int:
        """The store's latest revision (one cheap request)."""

    @abstractmethod
    def compact(self, revision: int) -> None:
        """Discard the history before `revision` (etcd's compaction; an operator's task)."""

    @abstractmethod
    def grant_lease(self, ttl_s: int) -> Lease: ...

    def resume_lease(self, lease_id: int, ttl_s: int) -> Lease:
        """A lease granted earlier (by this process or a previous one), refreshed now.

        MetadataError if it has expired: its keys are gone and whoever relied on them may have
        acted (a broker restarting on its own data uses this to keep its registration).
        """
        lease = self._lease_handle(lease_id, ttl_s)
        lease.refresh()
        return lease

    def refresh_leases(self, leases: list[Lease]) -> list[Lease]:
        """Refresh every lease of `leases`; returns those that had already expired (their keys
        are gone). One by one here; a store that can refresh many in one request does (etcd:
        one LeaseKeepAlive stream for all, where each `Lease.refresh` opens a stream of its own,
        e.g. a speed-layer leader refreshing 100 workers' leases every heartbeat)."""
        expired = []
        for lease in leases:
            try:
                lease.refresh()
            except MetadataError as exc:
                if exc.retriable:
                    raise
                expired.append(lease)
        return expired

    def revoke_lease(self, lease_id: int) -> None:
        """Revoke a lease granted earlier, by this process or another: its keys vanish now.
        A lease already gone (revoked or expired) is not an error."""
        self._lease_handle(lease_id, 1).revoke()

    def _lease_handle(self, lease_id: int, ttl_s: int) -> Lease:
        raise NotImplementedError(f"{type(self).__name__} cannot resume lease {lease_id:x}")

    @abstractmethod
    def watch_prefix(
        self, prefix: str, callback: WatchCallback, *, start_revision: int | None = None,
        on_lost: LostCallback | None = None,
    ) -> WatchHandle:
        """Call `callback` for every put/delete under `prefix`, asynchronously and in order.

        From now on, or from `start_revision` (inclusive) when given: MetadataCompactedError if
        that revision is compacted (raised here, or with `on_lost` possibly reported there). Without `on_lost` the watch outlives a broken stream by
        resubscribing after its last event (logging events lost to compaction). With `on_lost`
        it stops instead and `on_lost(error)` is called once, after the events it delivered:
        MetadataCompactedError if the history it needed is gone, MetadataUnavailableError if the
        stream broke. The owner then re-reads and watches again.
        """

    def sync_reads(self) -> None:  # noqa: B027 (a no-op unless a store caches reads)
        """Make later reads reflect every write committed anywhere before this call.

        A store reads etcd itself, so there is nothing to do; a store reading a local cache
        waits for the cache to catch up (for a negative answer that must not be stale).
        """

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> "MetadataStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_prefix(prefix: str) -> None:
    # An empty prefix would address the whole key space (and delete_prefix would wipe it).
    if not prefix:
        raise ValueError("metadata prefix must not be empty")


def prefix_end(prefix: str) -> str:
    """The smallest key above every key starting with `prefix` (etcd's range end for a prefix).

    UTF-8 keeps code point order, so bumping the last character works in etcd's byte order too.
    """
    check_prefix(prefix)
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def check_limit(limit: int | None) -> None:
    if limit is not None and limit < 1:
        raise ValueError(f"get_range limit={limit!r}: expected None or an integer >= 1")


def check_value(key: str, value: bytes) -> None:
    if not isinstance(value, bytes):
        raise TypeError(f"value for key {key!r} must be bytes, got {type(value).__name__}")


def check_ttl(ttl_s: int) -> None:
    if not isinstance(ttl_s, int) or ttl_s < 1:
        raise ValueError(f"lease ttl_s={ttl_s!r}: expected an integer number of seconds >= 1")
