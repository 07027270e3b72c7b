"""`LocalCache`: the contract written once (run here on the in-memory store, and on a real etcd
in tests/integration/test_local_cache.py), plus faults the in-memory store can inject.

Every test works under its own key prefix; every wait has a deadline.
"""

from __future__ import annotations

import queue
import random
import threading
from typing import Iterator

import pytest

from danube_core.cached_store import CachedMetadataStore
from danube_core.errors import StaleCacheError
from danube_core.keys import padded_offset
from danube_core.key_spans import Span, SpanIndex
from danube_core.local_cache import LocalCache
from danube_core.metadata import MetadataStore, WatchEvent
from danube_core.metadata_memory import MemoryMetadataStore
from tests.rig import CompactsAfterFirstRead, CountingStore, eventually

pytestmark = pytest.mark.unit

WAIT_S = 20.0


def _events(cache: LocalCache, prefix: str) -> "queue.SimpleQueue[WatchEvent]":
    seen: queue.SimpleQueue[WatchEvent] = queue.SimpleQueue()
    cache.subscribe(prefix, seen.put)
    return seen


class LocalCacheContract:
    """Subclasses provide `store`; every test here must hold for each backend."""

    @pytest.fixture
    def prefix(self, unique_name) -> str:
        return f"/cache/{unique_name('lc')}/"

    @pytest.fixture
    def cache_of(self, store: MetadataStore) -> Iterator:
        caches: list[LocalCache] = []

        def make(*prefixes: str, on: MetadataStore | None = None) -> LocalCache:
            cache = LocalCache(on or store, list(prefixes), name="test").start()
            caches.append(cache)
            return cache

        yield make
        for cache in caches:
            cache.close()

    def test_loads_what_is_there_and_answers_as_the_store_does(self, store, cache_of, prefix):
        a, b = prefix + "a/", prefix + "b/"
        for i in range(25):
            store.put(a + padded_offset(i * 10), b"%d" % i)
        store.put(b + "x", b"x")
        store.put(prefix + "outside", b"not cached")
        cache = cache_of(a, b)
        assert cache.get_prefix(a) == store.get_prefix(a)
        assert cache.get_prefix(a, keys_only=True) == store.get_prefix(a, keys_only=True)
        assert cache.get(b + "x") == b"x" and cache.get(b + "y") is None
        for lo, hi, limit in [(0, 100, None), (15, 95, None), (15, 95, 1), (0, 250, 7), (250, 999, 3)]:
            args = (a + padded_offset(lo), a + padded_offset(hi), limit)
            assert cache.get_range(*args) == store.get_range(*args)
        assert 0 < cache.revision <= store.current_revision()

    def test_reads_outside_its_prefixes_are_a_programming_error(self, cache_of, prefix):
        cache = cache_of(prefix + "a/")
        with pytest.raises(ValueError, match="outside"):
            cache.get(prefix + "b/k")
        with pytest.raises(ValueError, match="outside"):
            cache.get_prefix(prefix)
        with pytest.raises(ValueError, match="outside"):
            cache.get_range(prefix + "a/k", prefix + "b/")
        with pytest.raises(ValueError, match="limit"):
            cache.get_range(prefix + "a/", prefix + "a/z", limit=0)

    def test_read_your_writes(self, store, cache_of, prefix):
        cache = cache_of(prefix)
        for i in range(30):
            revision = store.put(prefix + "k", b"%d" % i)
            cache.wait_for_revision(revision, WAIT_S)
            assert cache.get(prefix + "k") == b"%d" % i
        revision = store.compare_and_put_revision(prefix + "k", b"29", b"swapped")
        assert revision is not None
        cache.wait_for_revision(revision, WAIT_S)
        assert cache.get(prefix + "k") == b"swapped"
        assert store.compare_and_put_revision(prefix + "k", b"29", b"lost race") is None

    def test_wait_for_a_revision_it_never_sees_times_out(self, store, cache_of, prefix):
        cache = cache_of(prefix)
        revision = store.put(prefix + "k", b"v")
        with pytest.raises(StaleCacheError, match="not at") as raised:
            cache.wait_for_revision(revision + 1_000_000, 0.2)
        assert raised.value.retriable

    def test_follows_puts_and_deletes_under_load(self, store, cache_of, prefix):
        a, b = prefix + "a/", prefix + "b/"
        cache = cache_of(a, b)
        done: list[int] = []

        def writer(seed: int) -> None:
            rng = random.Random(seed)
            for i in range(150):
                key = (a if rng.random() < 0.5 else b) + "k%02d" % rng.randrange(40)
                if rng.random() < 0.3:
                    store.delete(key)
                else:
                    store.put(key, b"%d-%d" % (seed, i))
            done.append(store.put(prefix + "a/done-%d" % seed, b"done"))  # deletes return no revision

        threads = [threading.Thread(target=writer, args=(seed,)) for seed in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S)
        assert len(done) == 4
        cache.wait_for_revision(max(done), WAIT_S)
        assert cache.get_prefix(a) == store.get_prefix(a)
        assert cache.get_prefix(b) == store.get_prefix(b)

    def test_subscribers_hear_changes_under_their_prefix_after_they_apply(self, store, cache_of, prefix):
        cache = cache_of(prefix)
        applied = queue.SimpleQueue()
        cache.subscribe(prefix + "sub/", lambda event: applied.put((event, cache.get(event.key))))
        store.put(prefix + "other", b"ignored")
        revision = store.put(prefix + "sub/k", b"v")
        store.delete(prefix + "sub/k")
        event, seen_value = applied.get(timeout=WAIT_S)
        assert (event.kind, event.key, event.value, event.revision) == ("put", prefix + "sub/k", b"v", revision)
        assert seen_value == b"v"  # the cache already held it when the subscriber ran
        event, seen_value = applied.get(timeout=WAIT_S)
        assert (event.kind, seen_value) == ("delete", None)

    def test_reads_never_reach_the_store(self, store, cache_of, prefix):
        counting = CountingStore(store)
        for i in range(50):
            store.put(prefix + padded_offset(i), b"v")
        cache = cache_of(prefix, on=counting)
        after_load = counting.reads
        for i in range(200):
            cache.get(prefix + padded_offset(i % 60))
            cache.get_range(prefix + padded_offset(i % 50), prefix + padded_offset(100), limit=3)
        cache.get_prefix(prefix)
        assert counting.reads == after_load == 1  # one range read of the single prefix

    # ---- spans: key ranges, filters, added and dropped while running -----------------------

    def test_a_span_holds_its_key_range_and_the_keys_its_filter_keeps(self, store, prefix):
        for i in range(10):
            store.put(prefix + "d/" + padded_offset(i), b"%d" % i)
        store.put(prefix + "f/keep-1", b"k")
        store.put(prefix + "f/drop-1", b"d")
        cache = LocalCache(store, spans=[
            (prefix + "d/" + padded_offset(4), prefix + "d0", None),
            (prefix + "f/", prefix + "f0", lambda key: "/keep-" in key)], name="test").start()
        try:
            assert [k for k, _ in cache.get_prefix(prefix + "f/")] == [prefix + "f/keep-1"]
            assert cache.get_range(prefix + "d/" + padded_offset(4), prefix + "d0") == \
                store.get_range(prefix + "d/" + padded_offset(4), prefix + "d0")
            with pytest.raises(ValueError, match="outside"):
                cache.get_range(prefix + "d/", prefix + "d0")  # below the span's start
            store.put(prefix + "f/drop-2", b"d")
            store.put(prefix + "d/" + padded_offset(2), b"below")
            revision = store.put(prefix + "f/keep-2", b"k")
            cache.wait_for_revision(revision, WAIT_S)
            assert [k for k, _ in cache.get_prefix(prefix + "f/")] == [prefix + "f/keep-1", prefix + "f/keep-2"]
            assert cache.get(prefix + "d/" + padded_offset(4)) == b"4"
        finally:
            cache.close()

    def test_cover_adds_a_span_while_running_and_uncover_drops_one(self, store, prefix):
        for i in range(10):
            store.put(prefix + "d/" + padded_offset(i), b"%d" % i)
        cache = LocalCache(store, spans=[(prefix + "d/" + padded_offset(8), prefix + "d0", None)],
                           watch_prefix=prefix, name="test").start()
        try:
            store.put(prefix + "d/" + padded_offset(3), b"changed before the cover")
            low = (prefix + "d/" + padded_offset(2), prefix + "d/" + padded_offset(8))
            assert not cache.covers(*low)
            cache.cover(*low)
            assert cache.covers(*low) and cache.covers(low[0], prefix + "d0")
            assert cache.get_range(low[0], prefix + "d0") == store.get_range(low[0], prefix + "d0")
            revision = store.put(prefix + "d/" + padded_offset(5), b"changed after the cover")
            cache.wait_for_revision(revision, WAIT_S)
            assert cache.get(prefix + "d/" + padded_offset(5)) == b"changed after the cover"
            assert cache.uncover(low[0], prefix + "d/" + padded_offset(6)) == 4
            assert not cache.covers(low[0], prefix + "d0") and cache.covers(prefix + "d/" + padded_offset(6), prefix + "d0")
            store.put(prefix + "d/" + padded_offset(3), b"no longer held")
            revision = store.put(prefix + "d/" + padded_offset(9), b"still held")
            cache.wait_for_revision(revision, WAIT_S)
            assert cache.get(prefix + "d/" + padded_offset(9)) == b"still held"
            assert [k for k, _ in cache._values.items() if k < prefix + "d/" + padded_offset(6)] == []
            with pytest.raises(ValueError, match="watched prefix"):
                cache.cover("/elsewhere/", "/elsewhere0")
        finally:
            cache.close()

    def test_keys_held_counts_what_the_spans_hold_as_they_come_and_go(self, store, prefix):
        for name in ("a", "b"):
            for i in range(5):
                store.put(f"{prefix}{name}/{i}", b"v")
        cache = LocalCache(store, [prefix + "a/"], watch_prefix=prefix, name="test").start()
        try:
            assert cache.keys_held == 5
            cache.cover(prefix + "b/", prefix + "b0", keep=lambda key: not key.endswith("/4"))
            assert cache.keys_held == 9
            store.delete(prefix + "a/0")
            revision = store.put(prefix + "outside", b"not held")
            cache.wait_for_revision(revision, WAIT_S)
            assert cache.keys_held == 8
            cache.uncover(prefix + "b/", prefix + "b0")
            assert cache.keys_held == 4
        finally:
            cache.close()

    def test_a_change_made_while_a_cover_lists_is_applied_after_it(self, store, prefix):
        class WriteDuringListing:
            """The store, with a write landing right after `cover`'s listing read."""

            def __init__(self) -> None:
                self.armed = False

            def __getattr__(self, name):
                return getattr(store, name)

            def range_at(self, start, end, revision=None):
                read = store.range_at(start, end, revision)
                if self.armed:
                    self.armed = False
                    store.put(prefix + "late/k", b"written during the listing")
                return read

        racing = WriteDuringListing()
        cache = LocalCache(racing, spans=[(prefix + "a/", prefix + "a0", None)], watch_prefix=prefix,  # type: ignore[arg-type]
                           name="test").start()
        try:
            racing.armed = True
            cache.cover(prefix + "late/", prefix + "late0")
            eventually(lambda: cache.get(prefix + "late/k") == b"written during the listing", deadline_s=WAIT_S)
        finally:
            cache.close()




class CompactingStore(CompactsAfterFirstRead, MemoryMetadataStore):
    """Right after the first `range_at`, writes twice and compacts past the revision it read."""

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key
        self.compacted = False


class TestMemoryLocalCache(LocalCacheContract):
    @pytest.fixture
    def store(self) -> Iterator[MetadataStore]:
        with MemoryMetadataStore() as store:
            yield store

    def test_compaction_past_its_revision_makes_it_relist(self, prefix):
        with CompactingStore(prefix + "k") as store:
            cache = LocalCache(store, [prefix]).start()
            cache.wait_for_revision(store.compacted_at, WAIT_S)  # only a re-list gets there
            assert cache.loads == 2
            assert cache.get(prefix + "k") == b"after the read"
            revision = store.put(prefix + "k", b"then watched")
            cache.wait_for_revision(revision, WAIT_S)
            assert cache.get(prefix + "k") == b"then watched"
            cache.close()

    def test_broken_stream_relists_and_subscribers_see_what_changed_meanwhile(self, store, cache_of, prefix):
        store.put(prefix + "gone", b"1")
        store.put(prefix + "kept", b"1")
        cache = cache_of(prefix)
        seen = _events(cache, prefix)
        assert store.interrupt_watches() >= 1
        # Changes while the cache re-lists; with history compacted, only a re-list finds them.
        store.delete(prefix + "gone")
        revision = store.put(prefix + "new", b"2")
        store.compact(revision)
        cache.wait_for_revision(revision, WAIT_S)
        eventually(lambda: cache.synced and cache.loads == 2, WAIT_S)
        assert cache.get_prefix(prefix) == store.get_prefix(prefix)
        changes = {seen.get(timeout=WAIT_S).key for _ in range(2)}
        assert changes == {prefix + "gone", prefix + "new"}

    def test_relist_keeps_trying_with_backoff_while_the_store_fails(self, prefix):
        class FlakyStore(MemoryMetadataStore):
            failures = 3

            def range_at(self, *args, **kwargs):
                if self.failures and self.interrupted:
                    self.failures -= 1
                    from danube_core.errors import MetadataUnavailableError

                    raise MetadataUnavailableError("etcd is down (test)")
                return super().range_at(*args, **kwargs)

        with FlakyStore() as store:
            store.interrupted = False
            cache = LocalCache(store, [prefix], max_backoff_s=0.2).start()
            store.put(prefix + "k", b"before")
            store.interrupted = True
            store.interrupt_watches()
            revision = store.put(prefix + "k", b"during")
            cache.wait_for_revision(revision, WAIT_S)
            assert store.failures == 0 and cache.get(prefix + "k") == b"during"
            cache.close()

    def test_closed_cache_refuses_waits(self, store, prefix):
        cache = LocalCache(store, [prefix]).start()
        cache.close()
        with pytest.raises(StaleCacheError, match="closed"):
            cache.wait_for_revision(cache.revision + 1, WAIT_S)


def test_nested_prefixes_are_listed_once():
    with MemoryMetadataStore() as store:
        store.put("/p/a/k", b"v")
        cache = LocalCache(store, ["/p/a/", "/p/", "/p/a/b/"]).start()
        assert cache.prefixes == ["/p/"]
        assert cache.get_prefix("/p/") == [("/p/a/k", b"v")]
        cache.close()


def _scan_covered(spans: list[Span], start_key: str, end_key: str) -> bool:
    """What `covers` answers, by a scan of every span (the index must agree)."""
    ready = [s for s in spans if s.pending is None]
    if any(s.start <= start_key and end_key <= s.end for s in ready):
        return True
    reached = start_key
    for span in sorted((s for s in ready if s.keep is None), key=lambda s: s.start):
        if span.start <= reached < span.end:
            reached = span.end
            if end_key <= reached:
                return True
    return False


def test_span_index_finds_what_a_scan_of_every_span_finds():
    rng = random.Random(25)
    letters = "abcdefghij"
    for _ in range(300):
        spans = []
        for _ in range(rng.randrange(1, 12)):
            start, end = sorted(rng.sample(letters, 2))
            keep = (lambda key: key[-1] in "aeiou") if rng.random() < 0.2 else None
            spans.append(Span(start, end, keep, pending=[] if rng.random() < 0.1 else None))
        index = SpanIndex(spans)
        for _ in range(30):
            key = rng.choice(letters) + rng.choice(["", "m"])
            assert {id(s) for s in index.around(key)} == {id(s) for s in spans if s.start <= key < s.end}
            start, end = rng.choice(letters), rng.choice(letters) + rng.choice(["", "m"])
            assert index.covered(start, end) == _scan_covered(spans, start, end), (spans, start, end)


def test_memory_store_reads_at_past_revisions_and_refuses_compacted_ones():
    from danube_core.errors import MetadataCompactedError

    with MemoryMetadataStore() as store:
        first = store.put("/r/a", b"1")
        store.put("/r/a", b"2")
        store.put("/r/b", b"3")
        store.delete("/r/a")
        assert store.range_at("/r/", "/r0", first).kvs == [("/r/a", b"1")]
        assert store.range_at("/r/", "/r0").kvs == [("/r/b", b"3")]
        store.compact(first + 1)
        with pytest.raises(MetadataCompactedError):
            store.range_at("/r/", "/r0", first)
        with pytest.raises(MetadataCompactedError):
            store.watch_prefix("/r/", lambda e: None, start_revision=first)


# ---- CachedMetadataStore: writes to the store, reads from the cache, reads its own writes --


class FrozenCache(LocalCache):
    """A cache whose watch never delivers (a watch stuck behind etcd)."""

    def _on_event(self, generation, event) -> None:
        return


def test_cached_store_reads_its_own_writes_at_once():
    with MemoryMetadataStore() as store:
        counting = CountingStore(store)
        cached = CachedMetadataStore(counting, LocalCache(store, ["/c/"]).start())
        for i in range(20):
            cached.put("/c/k", b"%d" % i)
            assert cached.get("/c/k") == b"%d" % i
        assert cached.compare_and_put("/c/k", b"19", b"x") and cached.get("/c/k") == b"x"
        assert cached.put_if_absent("/c/new", b"n") and cached.get_prefix("/c/", keys_only=True) == \
            [("/c/k", b""), ("/c/new", b"")]
        assert cached.delete("/c/new") and cached.get("/c/new") is None
        assert counting.reads == 0  # every read above came from the cache
        cached.close()


def test_cached_store_reads_other_keys_from_the_store():
    with MemoryMetadataStore() as store:
        counting = CountingStore(store)
        cached = CachedMetadataStore(counting, LocalCache(store, ["/c/"]).start())
        store.put("/elsewhere/k", b"v")
        assert cached.get("/elsewhere/k") == b"v" and cached.get_range("/c/", "/d/") == []
        assert counting.calls == {"get": 1, "get_range": 1}  # a range wider than the cache: the store
        cached.close()


def test_cached_store_sync_reads_sees_other_writers_and_falls_back_when_the_cache_is_stuck():
    with MemoryMetadataStore() as store:
        cached = CachedMetadataStore(store, LocalCache(store, ["/c/"]).start())
        store.put("/c/other-writer", b"v")  # not through the cached store
        cached.sync_reads()
        assert cached.get("/c/other-writer") == b"v"
        cached.close()
        stuck = CachedMetadataStore(store, FrozenCache(store, ["/c/"]).start(), wait_s=0.05)
        stuck.put("/c/k", b"mine")
        assert stuck.get("/c/k") == b"mine"  # from etcd: the cache never got there
        assert stuck.cache.get("/c/k") is None
        stuck.close()


def test_cached_store_watch_runs_after_the_cache_applied_the_change():
    with MemoryMetadataStore() as store:
        cached = CachedMetadataStore(store, LocalCache(store, ["/c/"]).start())
        seen = queue.SimpleQueue()
        handle = cached.watch_prefix("/c/a/", lambda event: seen.put((event.key, cached.cache.get(event.key))))
        store.put("/c/a/k", b"v")  # another writer: only the watch tells the cache
        assert seen.get(timeout=WAIT_S) == ("/c/a/k", b"v")
        handle.cancel()
        store.put("/c/a/k", b"w")
        revision = store.put("/c/a/z", b"z")
        cached.cache.wait_for_revision(revision, WAIT_S)
        assert seen.empty()  # cancelled: no more calls
        cached.close()
