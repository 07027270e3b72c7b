"""The Epoch Lifecycle as pure arithmetic: which epoch is served, which are superseded, and
what TTL and LRU-within-quota evict (never the served epoch, never one in flight)."""

from __future__ import annotations

import pytest

from speedlayer.master.lifecycle import LRU, TTL, evictions, served_epoch, superseded
from speedlayer.master.quotas import tenant_usage
from speedlayer.records import EVICTED, R_LOADING, R_READY, AssignmentRecord, ReplicaRecord

pytestmark = pytest.mark.unit


def epoch(version: int, *, ready_ms: int = 0, state: str = R_READY, base: str = "", size: int = 100,
          dataset: str = "orders", status: str = "ASSIGNED") -> AssignmentRecord:
    return AssignmentRecord(tenant="acme", dataset=dataset, epoch=f"v{version}", request_id="r", status=status,
                            version=version, estimated_memory_bytes=size, replication=1, created_ms=version,
                            ready_ms=ready_ms, base_epoch=base, kind="incremental" if base else "full",
                            replicas={"w1": ReplicaRecord(state=state)})


def ttl(seconds: float):
    return lambda tenant: seconds


def no_quota(tenant: str) -> int:
    return 0


def test_served_is_the_newest_with_a_ready_replica_and_newer_loading_epochs_are_in_flight():
    records = [epoch(1, ready_ms=1000), epoch(2, ready_ms=2000), epoch(3, state=R_LOADING)]
    assert served_epoch(records).epoch == "v2"
    assert superseded(records) == {"v1": 2000}  # superseded when v2 became READY
    assert served_epoch([epoch(1, state=R_LOADING)]) is None


def test_ttl_counts_from_when_an_epoch_was_superseded():
    records = [epoch(1, ready_ms=1000), epoch(2, ready_ms=5000), epoch(3, ready_ms=9000)]
    chosen = evictions(records, now_ms=10_000, ttl_s=ttl(5), quota_bytes=no_quota)
    assert [(e.record.epoch, e.reason) for e in chosen] == [("v1", TTL)]  # v2 superseded at 9000: 1 s ago
    chosen = evictions(records, now_ms=14_000, ttl_s=ttl(5), quota_bytes=no_quota)
    assert [e.record.epoch for e in chosen] == ["v1", "v2"]


def test_the_served_epoch_is_never_evicted_even_past_its_ttl_or_over_quota():
    records = [epoch(1, ready_ms=1000, size=10_000)]
    assert evictions(records, now_ms=10**9, ttl_s=ttl(0), quota_bytes=lambda t: 1) == []


def test_an_explicitly_admitted_old_version_keeps_its_ttl_from_admission():
    old = epoch(1, ready_ms=0)
    old = AssignmentRecord(**{**old.__dict__, "created_ms": 50_000})
    records = [old, epoch(2, ready_ms=1000)]
    assert evictions(records, now_ms=52_000, ttl_s=ttl(5), quota_bytes=no_quota) == []


def test_lru_evicts_least_recently_served_until_the_tenant_fits():
    records = [epoch(1, ready_ms=1000), epoch(2, ready_ms=2000), epoch(3, ready_ms=3000), epoch(4, ready_ms=4000)]
    assert tenant_usage(records, "acme") == 400
    chosen = evictions(records, now_ms=5000, ttl_s=ttl(3600), quota_bytes=lambda t: 250)
    assert [(e.record.epoch, e.reason) for e in chosen] == [("v1", LRU), ("v2", LRU)]
    chosen = evictions(records, now_ms=5000, ttl_s=ttl(3600), quota_bytes=lambda t: 400, need_bytes=lambda t: 100)
    assert [e.record.epoch for e in chosen] == ["v1"]  # room for a new epoch of 100


def test_lru_takes_a_base_together_with_the_increments_that_share_its_tables():
    # v1 full (100), v2 and v3 increments of 10 each, v4 a rebuild (120) served.
    records = [epoch(1, ready_ms=1000), epoch(2, ready_ms=2000, base="v1", size=110),
               epoch(3, ready_ms=3000, base="v2", size=120), epoch(4, ready_ms=4000, size=120)]
    assert tenant_usage(records, "acme") == 100 + 10 + 10 + 120
    chosen = evictions(records, now_ms=5000, ttl_s=ttl(3600), quota_bytes=lambda t: 235)
    assert [e.record.epoch for e in chosen] == ["v1", "v2", "v3"]  # only the whole run frees memory
    assert evictions(records[:3], now_ms=5000, ttl_s=ttl(3600), quota_bytes=lambda t: 1) == []


def test_evicted_and_other_datasets_do_not_interfere():
    records = [epoch(1, ready_ms=1000, status=EVICTED), epoch(2, ready_ms=2000),
               epoch(1, ready_ms=1000, dataset="other"), epoch(2, ready_ms=9000, dataset="other")]
    chosen = evictions(records, now_ms=10_000, ttl_s=ttl(5), quota_bytes=no_quota)
    assert [(e.record.dataset, e.record.epoch) for e in chosen] == []
    chosen = evictions(records, now_ms=15_000, ttl_s=ttl(5), quota_bytes=no_quota)
    assert [(e.record.dataset, e.record.epoch) for e in chosen] == [("other", "v1")]
