"""`LocalCache` on a real etcd: the contract of tests/unit/test_local_cache.py, then what only
a real server does: compaction past the cache's revision, and etcd killed and restarted under
a cache. Those use an etcd of their own (the session's is shared by every test)."""

from __future__ import annotations

import os
import queue
import tempfile
from typing import Iterator

import pytest

from danube_core.embedded_etcd import EmbeddedEtcd
from danube_core.errors import MetadataCompactedError
from danube_core.local_cache import LocalCache
from danube_core.metadata import MetadataStore
from danube_core.metadata_etcd import EtcdMetadataStore
from tests.rig import CompactsAfterFirstRead, eventually
from tests.unit.test_local_cache import WAIT_S, LocalCacheContract

pytestmark = pytest.mark.integration


class TestEtcdLocalCache(LocalCacheContract):
    @pytest.fixture
    def store(self, etcd_endpoint: str) -> Iterator[MetadataStore]:
        with EtcdMetadataStore(etcd_endpoint) as store:
            yield store


@pytest.fixture
def own_etcd() -> Iterator[EmbeddedEtcd]:
    data_dir = tempfile.mkdtemp(prefix="danube-cache-etcd-")
    server = EmbeddedEtcd(data_dir=os.path.join(data_dir, "etcd"))
    yield server
    server.stop()


class CompactingEtcdStore(CompactsAfterFirstRead, EtcdMetadataStore):
    """Right after the first `range_at`, writes twice and compacts past the revision it read."""


def test_range_at_a_compacted_revision_says_so(own_etcd):
    with EtcdMetadataStore(own_etcd.endpoint) as store:
        first = store.put("/compact/k", b"1")
        store.compact(store.put("/compact/k", b"2"))
        with pytest.raises(MetadataCompactedError):
            store.range_at("/compact/", "/compact0", first)
        # etcd creates the watch, then cancels it as compacted: reported through on_lost.
        lost = queue.SimpleQueue()
        try:
            store.watch_prefix("/compact/", lambda e: None, start_revision=first, on_lost=lost.put)
        except MetadataCompactedError as exc:
            lost.put(exc)
        assert isinstance(lost.get(timeout=WAIT_S), MetadataCompactedError)
        assert store.range_at("/compact/", "/compact0").kvs == [("/compact/k", b"2")]


def test_compaction_past_its_revision_makes_it_relist(own_etcd):
    with CompactingEtcdStore(own_etcd.endpoint) as store:
        store.key = "/compaction/k"
        with LocalCache(store, ["/compaction/"]).start() as cache:
            cache.wait_for_revision(store.compacted_at, WAIT_S)  # only a re-list gets there
            assert cache.loads == 2
            assert cache.get("/compaction/k") == b"after the read"
            revision = store.put("/compaction/k", b"then watched")
            cache.wait_for_revision(revision, WAIT_S)
            assert cache.get("/compaction/k") == b"then watched"


def test_etcd_killed_and_restarted_under_the_cache(own_etcd):
    port, data_dir = own_etcd.port, own_etcd.data_dir
    with EtcdMetadataStore(own_etcd.endpoint, timeout_s=2.0) as store:
        store.put("/restart/a/gone", b"1")
        store.put("/restart/a/kept", b"1")
        with LocalCache(store, ["/restart/a/", "/restart/b/"], max_backoff_s=0.5).start() as cache:
            own_etcd.process.kill()
            own_etcd.process.wait(10)
            eventually(lambda: not cache.synced, WAIT_S)
            assert cache.get("/restart/a/gone") == b"1"  # stale reads go on while etcd is down
            restarted = EmbeddedEtcd(data_dir=data_dir, client_port=port)
            try:
                eventually(lambda: cache.synced, 30.0)
                store.delete("/restart/a/gone")
                revision = store.put("/restart/b/new", b"2")
                cache.wait_for_revision(revision, WAIT_S)
                assert cache.get_prefix("/restart/a/") == [("/restart/a/kept", b"1")]
                assert cache.get("/restart/b/new") == b"2"
                assert cache.loads >= 2
            finally:
                restarted.stop()
