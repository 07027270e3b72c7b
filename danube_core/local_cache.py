"""A per-process copy of some etcd prefixes, kept current by a watch (Danube's LocalCache).

Danube brokers write to etcd and read from a local cache that an etcd watch keeps current
(seeds 000/001: Put/Delete go to the MetadataStore, Get is served from the LocalCache).
`LocalCache` is that cache for the broker, the connector's driver and anything else that reads
the same keys many times:

* It loads its spans (whole prefixes, or key ranges such as "a topic's descriptors from offset N
  on", optionally keeping only the keys a filter accepts) with range reads pinned to one
  revision R, then watches from R + 1, so no change is missed or applied twice. Reads (`get`,
  `get_range`, `get_prefix`, the read half of `MetadataStore`, same signatures and semantics)
  are served from memory and never touch etcd; reading a key outside the cache's spans is a
  programming error (ValueError). A filtered span answers a range with the keys it keeps.
* One watch covers all spans (on their longest common prefix, or a wider `watch_prefix` given
  up front), so events arrive in revision order and `revision` is the store revision the whole
  cache reflects.
* Spans can be added (`cover`) and dropped (`uncover`) while the cache runs, so a reader's
  cache follows what it reads (a stream's topics, the window of a topic's history it is in)
  instead of holding the whole key space. A span added at etcd revision R' ignores the
  watch's events up to R' (its listing already holds them) and applies the later ones. Spans
  are found by bisection (`SpanIndex`), so a cache of thousands of them (a broker's served
  topics) pays O(log spans) per event and per read.
* When the watch is lost (stream broken, etcd restarted, or the history it needs compacted) the
  cache keeps serving what it has, and a background thread re-lists and watches again, with
  capped exponential backoff. Subscribers see the differences the re-list found as events.
* Read-your-writes: a writer passes the revision its write returned (`MetadataStore.put`,
  `compare_and_put_revision`) to `wait_for_revision`, which returns once the cache has applied
  it, or raises StaleCacheError at the deadline.

Subscriber callbacks run after the change is applied, on the store's watch dispatcher thread
(or on the re-list thread), in revision order; they must not block for long.
"""

from __future__ import annotations

import bisect
import functools
import logging
import os
import threading
import time
from typing import Callable, Iterable

from danube_core.errors import DanubeError, MetadataCompactedError, StaleCacheError
from danube_core.key_spans import KeyFilter, Span, SpanIndex
from danube_core.metadata import (
    KeyValues, MetadataStore, WatchCallback, WatchEvent, WatchHandle, check_limit, prefix_end,
)

logger = logging.getLogger(__name__)

INITIAL_BACKOFF_S = 0.1
MAX_BACKOFF_S = 5.0
COVERED_MEMO_ENTRIES = 4096


class Subscription:
    """A subscriber to changes under one prefix of a cache; `cancel()` stops the calls."""

    def __init__(self, prefix: str, callback: WatchCallback, on_cancel: Callable[["Subscription"], None]) -> None:
        self.prefix = prefix
        self.callback = callback
        self._on_cancel = on_cancel

    def cancel(self) -> None:
        self._on_cancel(self)


class LocalCache:
    """The keys of some spans of etcd, loaded once and kept current by a watch; see the module
    docstring.

    `prefixes`: whole prefixes; `spans`: `(start_key, end_key, keep)` key ranges, `keep` None or
    a filter of the keys held. `watch_prefix`: the prefix watched, when spans will be added
    later outside the initial ones' common prefix. `start()` loads and watches (raising if etcd
    cannot be read); `close()` stops the watch. Counters for tests and benchmarks: `loads`
    (full listings), `spans_added` (spans listed while running) and `events` (changes applied).
    """

    def __init__(self, store: MetadataStore, prefixes: Iterable[str] = (), *, name: str = "metadata-cache",
                 max_backoff_s: float = MAX_BACKOFF_S,
                 spans: Iterable[tuple[str, str, KeyFilter | None]] = (), watch_prefix: str | None = None) -> None:
        ordered = sorted(set(prefixes))
        # A prefix inside another one is already covered (and would be listed twice).
        self.prefixes = [p for p in ordered if not any(p != q and p.startswith(q) for q in ordered)]
        self._spans = [Span(p, prefix_end(p)) for p in self.prefixes]
        self._spans += [Span(start, end, keep) for start, end, keep in spans]
        if not self._spans:
            raise ValueError("a LocalCache needs at least one key prefix or span")
        bounds = [b for span in self._spans for b in (span.start, span.end)]
        self._watch_prefix = watch_prefix if watch_prefix is not None else os.path.commonprefix(bounds)
        if not self._watch_prefix:
            raise ValueError(f"cache spans {[(s.start, s.end) for s in self._spans]!r} share no common "
                             "prefix to watch")
        for span in self._spans:
            self._check_watched(span.start, span.end)
        self._index = SpanIndex(self._spans)
        self._store = store
        self._name = name
        self._max_backoff_s = max_backoff_s
        self._cond = threading.Condition(threading.RLock())
        self._values: dict[str, bytes] = {}
        self._keys: list[str] = []  # sorted: range reads bisect it
        self._revision = 0
        self._generation = 0  # bumped per (re)load; events of older watches are ignored
        self._handle: WatchHandle | None = None
        self._subscribers: list[Subscription] = []
        self._recovering = False
        self._synced = False
        self._closed = False
        self._layout = threading.Lock()  # one listing at a time: (re)loads, cover, uncover
        self._covered: dict[tuple[str, str], bool] = {}  # `covers` answers until the spans change
        self.loads = 0
        self.spans_added = 0
        self.events = 0

    def __repr__(self) -> str:
        return f"LocalCache({self._name}, {len(self._spans)} span(s) under {self._watch_prefix!r}, " \
               f"revision {self._revision})"

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self) -> "LocalCache":
        """Load the prefixes and start watching; MetadataError if etcd cannot be read."""
        while True:
            try:
                self._sync()
                return self
            except MetadataCompactedError:  # compacted between our read and our watch: again
                continue

    def close(self) -> None:
        with self._cond:
            self._closed = True
            handle, self._handle = self._handle, None
            self._synced = False
            self._cond.notify_all()
        if handle is not None:
            handle.cancel()

    def __enter__(self) -> "LocalCache":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def revision(self) -> int:
        """The store revision the cache reflects: every change up to it is applied."""
        with self._cond:
            return self._revision

    @property
    def keys_held(self) -> int:
        """How many keys the cache holds now (what its memory grows with)."""
        with self._cond:
            return len(self._values)

    @property
    def synced(self) -> bool:
        """True while the watch is live; False while the cache recovers (reads may be stale)."""
        with self._cond:
            return self._synced

    # ---- reads (the read half of MetadataStore) ---------------------------------------------

    def get(self, key: str) -> bytes | None:
        self._check_range(key, key + "\0")
        with self._cond:
            return self._values.get(key)

    def get_range(self, start_key: str, end_key: str, limit: int | None = None) -> KeyValues:
        """Keys in [start_key, end_key), sorted, at most `limit` of them."""
        check_limit(limit)
        self._check_range(start_key, end_key)
        with self._cond:
            lo = bisect.bisect_left(self._keys, start_key)
            hi = bisect.bisect_left(self._keys, end_key, lo)
            if limit is not None:
                hi = min(hi, lo + limit)
            return [(k, self._values[k]) for k in self._keys[lo:hi]]

    def get_prefix(self, prefix: str, keys_only: bool = False) -> KeyValues:
        """All keys starting with `prefix`, sorted; values are b"" when `keys_only`."""
        rows = self.get_range(prefix, prefix_end(prefix))
        return [(k, b"") for k, _ in rows] if keys_only else rows

    def covers(self, start_key: str, end_key: str) -> bool:
        """Whether reads of `[start_key, end_key)` are this cache's to answer: one span holds the
        whole range (a filtered span answers with the keys it keeps), or unfiltered spans do
        end to end (a window lowered by `cover` below the span it started with)."""
        with self._cond:
            known = self._covered.get((start_key, end_key))
            if known is None:
                if len(self._covered) >= COVERED_MEMO_ENTRIES:  # ranges read at ever new offsets
                    self._covered.clear()
                known = self._covered[(start_key, end_key)] = self._index.covered(start_key, end_key)
            return known

    def _check_range(self, start_key: str, end_key: str) -> None:
        if not self.covers(start_key, end_key):
            raise ValueError(f"key range [{start_key!r}, {end_key!r}) is outside the {self._name} cache's "
                             f"spans {[(s.start, s.end) for s in self._spans]}")

    def _check_watched(self, start_key: str, end_key: str) -> None:
        if not (start_key.startswith(self._watch_prefix) and end_key <= prefix_end(self._watch_prefix)):
            raise ValueError(f"span [{start_key!r}, {end_key!r}) is outside the {self._name} cache's "
                             f"watched prefix {self._watch_prefix!r}")

    def _holds(self, key: str, revision: int) -> bool:
        """Under the lock: whether an event at `revision` on `key` changes what the cache holds."""
        return any(s.holds(key) and s.pending is None and revision > s.loaded_at for s in self._index.around(key))

    def _set_spans(self, spans: list[Span]) -> None:
        """Under the lock: the spans from now on."""
        self._spans = spans
        self._index = SpanIndex(spans)
        self._covered.clear()

    # ---- spans added and dropped while running ----------------------------------------------

    def cover(self, start_key: str, end_key: str, keep: KeyFilter | None = None) -> None:
        """Hold `[start_key, end_key)` (only the keys `keep` accepts) from now on: listed now,
        then kept current by the watch. MetadataError if etcd cannot be read."""
        self._check_watched(start_key, end_key)
        span = Span(start_key, end_key, keep, pending=[])
        with self._layout:
            with self._cond:
                self._set_spans([*self._spans, span])  # events from here on are kept in `pending`
            try:
                read = self._store.range_at(start_key, end_key)
            except BaseException:
                with self._cond:
                    self._set_spans([s for s in self._spans if s is not span])
                raise
            with self._cond:
                for key, value in read.kvs:
                    if (keep is None or keep(key)) and key not in self._values:
                        bisect.insort(self._keys, key)
                        self._values[key] = value
                span.loaded_at, pending, span.pending = read.revision, span.pending or [], None
                self._covered.clear()
                for event in pending:
                    if event.revision > read.revision:
                        self._apply(event)
                self.spans_added += 1
                self._cond.notify_all()

    def uncover(self, start_key: str, end_key: str) -> int:
        """Stop holding `[start_key, end_key)`: spans are cut there and the keys no remaining span
        holds are dropped. Returns the number of keys dropped."""
        with self._layout, self._cond:
            kept: list[Span] = []
            for span in self._spans:
                if span.end <= start_key or end_key <= span.start:
                    kept.append(span)
                    continue
                if span.start < start_key:
                    kept.append(Span(span.start, start_key, span.keep, span.loaded_at, span.pending))
                if end_key < span.end:
                    kept.append(Span(end_key, span.end, span.keep, span.loaded_at, span.pending))
            self._set_spans(kept)
            lo = bisect.bisect_left(self._keys, start_key)
            hi = bisect.bisect_left(self._keys, end_key, lo)
            gone = [k for k in self._keys[lo:hi] if not any(s.holds(k) for s in self._index.around(k))]
            for key in gone:
                del self._values[key]
            if gone:
                self._keys[lo:hi] = [k for k in self._keys[lo:hi] if k in self._values]
            return len(gone)

    # ---- read-your-writes and subscribers ---------------------------------------------------

    def wait_for_revision(self, revision: int, timeout_s: float) -> None:
        """Return once the cache reflects `revision` (a write's, under the watched prefix).

        StaleCacheError if it has not within `timeout_s` (watch behind, or etcd unreachable).
        """
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._revision < revision:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    state = "closed" if self._closed else ("synced" if self._synced else "recovering")
                    raise StaleCacheError(
                        f"{self._name} cache is at revision {self._revision} ({state}), not at "
                        f"{revision}, after {timeout_s}s")
                self._cond.wait(left)

    def subscribe(self, prefix: str, callback: WatchCallback) -> Subscription:
        """Call `callback(event)` after each change under `prefix` is applied to the cache."""
        self._check_range(prefix, prefix_end(prefix))
        subscription = Subscription(prefix, callback, self._unsubscribe)
        with self._cond:
            self._subscribers.append(subscription)
        return subscription

    def _unsubscribe(self, subscription: Subscription) -> None:
        with self._cond:
            if subscription in self._subscribers:
                self._subscribers.remove(subscription)

    def _notify(self, events: list[WatchEvent]) -> None:
        with self._cond:
            subscribers = list(self._subscribers)
        for event in events:
            for sub in subscribers:
                if event.key.startswith(sub.prefix):
                    try:
                        sub.callback(event)
                    except Exception:  # one subscriber must not starve the others
                        logger.exception("%s subscriber for %r failed on %s", self._name, sub.prefix, event)

    # ---- loading and watching ---------------------------------------------------------------

    def _sync(self) -> None:
        """List every span at one revision, swap the data in, and watch from the next one."""
        with self._layout:
            self._list_and_watch()

    def _list_and_watch(self) -> None:
        rows: KeyValues = []
        revision: int | None = None
        with self._cond:
            spans = list(self._spans)
        for span in spans:
            read = self._store.range_at(span.start, span.end, revision)
            revision = read.revision
            rows.extend(kv for kv in read.kvs if span.keep is None or span.keep(kv[0]))
        assert revision is not None
        values = dict(rows)
        with self._cond:
            if self._closed:
                return
            for span in spans:
                span.loaded_at = revision
            self._generation += 1
            generation = self._generation
            old_handle, self._handle = self._handle, None
            changes = _differences(self._values, values, revision) if self.loads else []
            self._values, self._keys = values, sorted(values)
            self._revision = revision  # below the old one only if etcd lost its data
            self.loads += 1
            self._cond.notify_all()
        if old_handle is not None:
            old_handle.cancel()
        self._notify(changes)
        handle = self._store.watch_prefix(
            self._watch_prefix, functools.partial(self._on_event, generation),
            start_revision=revision + 1, on_lost=functools.partial(self._on_lost, generation),
        )
        with self._cond:
            if self._closed or generation != self._generation:
                stale = handle
            else:
                self._handle, self._synced, stale = handle, True, None
        if stale is not None:
            stale.cancel()
        logger.info("%s cache loaded %d keys at revision %d", self._name, len(values), revision)

    def _on_event(self, generation: int, event: WatchEvent) -> None:
        with self._cond:
            if generation != self._generation or self._closed:
                return
            for span in self._index.around(event.key):
                if span.pending is not None and span.holds(event.key):
                    span.pending.append(event)  # its listing is under way: applied after it
            covered = self._holds(event.key, event.revision)
            if covered:
                self._apply(event)
            self._revision = max(self._revision, event.revision)
            self._cond.notify_all()
        if covered:
            self._notify([event])

    def _apply(self, event: WatchEvent) -> None:
        """Under the lock: one put or delete into the dict and the sorted key list."""
        self.events += 1
        key = event.key
        if event.kind == "put":
            assert event.value is not None
            if key not in self._values:
                bisect.insort(self._keys, key)
            self._values[key] = event.value
        elif self._values.pop(key, None) is not None:
            del self._keys[bisect.bisect_left(self._keys, key)]

    def _on_lost(self, generation: int, error: DanubeError) -> None:
        with self._cond:
            if generation != self._generation or self._closed:
                return
            self._synced = False
            if self._recovering:
                return  # the running re-list sees `synced` False and lists again
            self._recovering = True
        logger.warning("%s cache lost its watch at revision %d (%s); re-listing", self._name,
                       self._revision, error)
        threading.Thread(target=self._recover, name=f"{self._name}-relist", daemon=True).start()

    def _recover(self) -> None:
        """Re-list and watch again until it works or the cache is closed, backing off."""
        delay_s = INITIAL_BACKOFF_S
        try:
            while not self._closed:
                try:
                    self._sync()
                except MetadataCompactedError:
                    continue  # compacted between the read and the watch: re-list at once
                except DanubeError as exc:
                    logger.warning("%s cache re-list failed, next try in %.1fs: %s", self._name, delay_s, exc)
                else:
                    with self._cond:
                        if self._synced:  # not lost again meanwhile (a loss then is ours to handle)
                            self._recovering = False
                            return
                    continue
                with self._cond:
                    self._cond.wait_for(lambda: self._closed, delay_s)
                delay_s = min(delay_s * 2, self._max_backoff_s)
        finally:
            with self._cond:
                self._recovering = False


def _differences(old: dict[str, bytes], new: dict[str, bytes], revision: int) -> list[WatchEvent]:
    """The events that turn `old` into `new`, in key order (what a re-list found changed)."""
    events = []
    for key in sorted(old.keys() | new.keys()):
        before, after = old.get(key), new.get(key)
        if after is None:
            events.append(WatchEvent("delete", key, None, revision))
        elif before != after:
            events.append(WatchEvent("put", key, after, revision))
    return events
