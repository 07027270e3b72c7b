"""The leader's per-change bookkeeping (`master.record_index`, issue 26 at 2,000 epochs): after any
sequence of record changes, every figure it keeps equals its computation from scratch over the
records as they now are; the reconciler's idle check skips its pass only when nothing changed and
nothing waits on the clock; a Delta version is resolved once."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest

from danube_core.metadata_memory import MemoryMetadataStore
from speedlayer.keys import SpeedLayerKeys
from speedlayer.master.desired import DesiredEpochs
from speedlayer.master.lifecycle import superseded_keys
from speedlayer.master.load_failures import replication_target
from speedlayer.master.placement import EpochPlacement, next_placement
from speedlayer.master.quotas import tenant_usage, usage
from speedlayer.master.reconciler import Reconciler, candidates_from, candidates_of, placed_as_is
from speedlayer.master.record_index import RecordIndex, epoch_counts, worker_loads_of
from speedlayer.master.state import ClusterState, ConfigView
from speedlayer.master.strategies import Candidate, PlanSummary, RendezvousStrategy
from speedlayer.master.worker_streams import StreamRegistry
from speedlayer.observability.audit import MemoryAuditLogger
from speedlayer.records import (
    ASSIGNED, EVICTED, FAILED, PENDING, PLANNED, R_ASSIGNED, R_FAILED, R_LOADING, R_READY, AssignmentRecord,
    GlobalConfig, ReplicaRecord, WorkerRecord,
)

pytestmark = pytest.mark.unit

CREATED = itertools.count(1)  # distinct creation times: no two records sort as equals
TENANTS, DATASETS, EPOCHS, WORKERS = ("t1", "t2"), ("d1", "d2", "d3"), ("e1", "e2", "e3", "e4"), ("w1", "w2", "w3")


def random_record(rng: random.Random, ref: tuple[str, str, str]) -> AssignmentRecord:
    tenant, dataset, epoch = ref
    replicas = {w: ReplicaRecord(state=rng.choice((R_ASSIGNED, R_LOADING, R_READY, R_FAILED)),
                                 leaving=rng.random() < 0.2)
                for w in rng.sample(WORKERS, rng.randint(0, 3))}
    shard_of = rng.choice(("", "", "", rng.choice(EPOCHS)))
    return AssignmentRecord(
        tenant=tenant, dataset=dataset, epoch=epoch, request_id=epoch,
        status=rng.choice((PENDING, PLANNED, ASSIGNED, ASSIGNED, FAILED, EVICTED)),
        version=rng.randint(0, 3), created_ms=next(CREATED), ready_ms=rng.choice((0, rng.randint(1, 9))),
        estimated_memory_bytes=rng.randint(0, 1000), replication=rng.randint(0, 3), replicas=replicas,
        base_epoch=rng.choice(("", "", rng.choice(EPOCHS))), kind="shard" if shard_of else "full",
        load_failures={"w9": "gone"} if rng.random() < 0.2 else {},
        shards=tuple(f"{epoch}.s{i}" for i in range(rng.choice((0, 0, 0, 2)))) if not shard_of else (),
        shard_of=shard_of)


def key_of(record: AssignmentRecord) -> str:
    return f"/a/{record.tenant}/{record.dataset}/{record.epoch}"


def placed_epochs(records: list[AssignmentRecord], max_failures: int = 3) -> list[EpochPlacement]:
    """The epochs a reconciliation pass hands to `next_placement`, from scratch."""
    old = superseded_keys(records)
    return [EpochPlacement(PlanSummary(r.tenant, r.dataset, r.epoch, r.estimated_memory_bytes),
                           replication_target(r, max_failures), r.staying(), frozenset(r.load_failures))
            for r in records if r.status in (PLANNED, ASSIGNED) and (r.tenant, r.dataset, r.epoch) not in old
            and not r.sharded]


def assert_equals_scratch(index: RecordIndex, records: dict[str, AssignmentRecord],
                          desired: dict | None = None) -> None:
    """`desired`: what the reconciler keeps of `take_desired` (brought up to date here)."""
    now = list(records.values())
    counts: dict[tuple[str, str], int] = {}
    placed = placed_epochs(now, max_failures=10**6)  # never spent: the target is the replication
    for epoch in placed:
        for worker in epoch.workers:
            counts[(epoch.plan.tenant, worker)] = counts.get((epoch.plan.tenant, worker), 0) + 1
    assert index.placement_counts() == counts
    assert [(r.tenant, r.dataset, r.epoch) for r in index.short()] == sorted(
        tuple(e.plan.key.split("/")) for e in placed if len(e.workers) < e.replication)
    if desired is not None:
        for key, held in index.take_desired().items():
            if held:
                desired[key] = held
            else:
                desired.pop(key, None)
        scratch = DesiredEpochs.of(now).by_worker
        assert desired == scratch
        assert all(list(desired[k]) == list(scratch[k]) for k in scratch)  # oldest first
        assert all(list(index.desired_of(k)) == list(scratch[k]) for k in scratch)
    holders = {(r.tenant, w) for r in now for w in r.replicas}
    for key in holders | {("t1", "nobody")}:
        assert index.records_on(key) == sorted((r for r in now if r.tenant == key[0] and key[1] in r.replicas),
                                               key=lambda r: (r.tenant, r.dataset, r.epoch))
    assert index.worker_loads() == worker_loads_of(now)
    for tenant in TENANTS:
        assert index.usage(tenant) == (tenant_usage(now, tenant), usage(now))
    assert index.epoch_counts() == (epoch_counts(r for r in now if not r.shard_of),
                                    epoch_counts(r for r in now if r.shard_of))
    assert index.superseded() == superseded_keys(now)
    named = {"failed_replicas": lambda r: any(x.state == R_FAILED for x in r.replicas.values()),
             "leaving": lambda r: any(x.leaving for x in r.replicas.values()),
             "load_failed": lambda r: bool(r.load_failures), "sharded": lambda r: bool(r.shards or r.shard_of),
             "evicted": lambda r: r.status == EVICTED}
    for name, wanted in named.items():
        assert getattr(index, name) == {k for k, r in records.items() if wanted(r)}, name
    for dataset in {(t, d) for t in TENANTS for d in DATASETS}:
        assert sorted(index.dataset_records(dataset), key=key_of) == sorted(
            (r for r in now if (r.tenant, r.dataset) == dataset), key=key_of)


@pytest.mark.parametrize("seed", range(4))
def test_record_index_equals_the_scan_after_any_sequence_of_changes(seed):
    rng = random.Random(seed)
    index, records, desired = RecordIndex(), {}, {}
    for _ in range(250):
        if records and rng.random() < 0.25:
            key = rng.choice(sorted(records))
            index.remove(key, records.pop(key))
        else:
            ref = (rng.choice(TENANTS), rng.choice(DATASETS), rng.choice(EPOCHS))
            record = random_record(rng, ref)
            records[key_of(record)] = record
            index.put(key_of(record), record)
        assert_equals_scratch(index, records, desired)


@pytest.mark.parametrize("seed", range(4))
def test_a_pass_skips_placement_only_when_next_placement_would_change_nothing(seed):
    """`placed_as_is` (from the index) True must mean `next_placement` (from scratch) changes
    nothing, whatever the records, candidates (draining or not) and kept workers."""
    rng = random.Random(100 + seed)
    index, records = RecordIndex(), {}
    skipped = 0
    for _ in range(300):
        ref = (rng.choice(TENANTS), rng.choice(DATASETS), rng.choice(EPOCHS))
        record = replace(random_record(rng, ref), load_failures={})
        if rng.random() < 0.5:  # mostly fully replicated and placed, as at rest
            record = replace(record, status=ASSIGNED, replication=len(record.staying()))
        records[key_of(record)] = record
        index.put(key_of(record), record)
        candidates = [Candidate(worker_id=w, tenant=t, draining=rng.random() < 0.03)
                      for t in TENANTS for w in WORKERS if rng.random() < 0.97]
        keep = {(t, w) for t in TENANTS for w in WORKERS if rng.random() < 0.05}
        changes = next_placement(placed_epochs(list(records.values())), candidates, keep, RendezvousStrategy())
        if placed_as_is(index.placement_counts(), index.short(), candidates, keep, 3):
            assert changes == {}
            skipped += 1
    assert skipped > 0  # the fast path is taken, not only the full placement


def test_an_increments_footprint_follows_its_base_both_ways():
    """The share of an increment depends on its base's record: the base changing (evicted,
    deleted, created after it) changes the increment's contribution, not only its own."""
    index, records = RecordIndex(), {}
    base = AssignmentRecord("t1", "d1", "e1", "e1", ASSIGNED, estimated_memory_bytes=600, replication=2,
                            replicas={"w1": ReplicaRecord(), "w2": ReplicaRecord()})
    increment = AssignmentRecord("t1", "d1", "e2", "e2", ASSIGNED, estimated_memory_bytes=1000, replication=2,
                                 base_epoch="e1", kind="incremental", replicas={"w1": ReplicaRecord()})
    for step in (increment, base, replace(base, status=EVICTED, replicas={}), None, base):
        if step is None:
            index.remove(key_of(base), records.pop(key_of(base)))
        else:
            records[key_of(step)] = step
            index.put(key_of(step), step)
        assert_equals_scratch(index, records)
    assert index.usage("t1") == (600 * 2 + 400 * 2, 2000)


def test_cluster_state_keeps_the_index_through_creates_updates_and_deletes():
    store, keys = MemoryMetadataStore(), SpeedLayerKeys("/record-index")
    state = ClusterState(store, keys, lambda: None)
    rng = random.Random(7)
    for step in range(60):
        ref = ("t1", rng.choice(DATASETS), rng.choice(EPOCHS))
        current = state.record(*ref)
        if current is None:
            state.create_record(random_record(rng, ref))
        elif step % 5 == 0:
            state.delete_record(current)
        else:
            state.update_record(*ref, lambda r, ref=ref: replace(random_record(rng, ref), request_id=r.request_id))
        assert_equals_scratch(state.index, dict(state.records))
    reloaded = ClusterState(store, keys, lambda: None)
    reloaded.load()  # a new leader's index, from what it reads
    assert_equals_scratch(reloaded.index, dict(reloaded.records))
    registered = {("t1", w): WorkerRecord(address="x", memory_bytes=5000, cpu_cores=1, master_id="m1") for w in WORKERS}
    assert candidates_from(state.worker_loads(), [], registered, set()) == candidates_of(
        list(state.records.values()), [], registered, set())
    reloaded.close()
    state.close()
    store.close()


def test_idle_reconciler_skips_its_pass_only_when_nothing_changed_and_nothing_is_timed():
    store, keys = MemoryMetadataStore(), SpeedLayerKeys("/record-index-quiet")
    config = ConfigView(store, keys)
    config.global_config = GlobalConfig(reassign_delay_s=0.0)
    store.put(keys.worker("t1", "w1"), WorkerRecord(address="x", memory_bytes=0, cpu_cores=1, master_id="m1").to_json())
    state = ClusterState(store, keys, lambda: None)
    state.load()
    reconciler = Reconciler(state, StreamRegistry(), config, RendezvousStrategy, MemoryAuditLogger(), "m1")
    assert not reconciler._quiet()  # no pass yet
    state.create_record(AssignmentRecord("t1", "d1", "e1", "e1", ASSIGNED, version=1,
                                         replicas={"w1": ReplicaRecord(state=R_READY)}))
    reconciler.run_once()
    assert reconciler._quiet()
    state.update_record("t1", "d1", "e1", lambda r: replace(r, message="changed"))
    assert not reconciler._quiet()  # a record changed since: the idle check runs a pass
    reconciler.run_once()
    assert reconciler._quiet()
    state.create_record(AssignmentRecord("t1", "d1", "e2", "e2", ASSIGNED, version=2,
                                         replicas={"w1": ReplicaRecord(state=R_READY)}))
    reconciler.run_once()
    assert state.superseded() == {("t1", "d1", "e1")}
    assert not reconciler._quiet()  # e1 superseded: its TTL runs on the clock, every idle check looks
    state.close()
    store.close()


def test_a_delta_version_is_resolved_once_and_as_the_plain_source_resolves_it(tmp_path, monkeypatch):
    import pyarrow as pa
    from deltalake import write_deltalake

    from speedlayer.master.table_cache import VersionCachedDeltaSource
    from speedlayer.sources.delta import DeltaTableSource

    path = str(tmp_path / "t")

    def append(start: int) -> None:
        write_deltalake(path, pa.table({"id": pa.array(range(start, start + 4), pa.int64()),
                                        "day": [f"d{i % 2}" for i in range(4)]}), partition_by=["day"], mode="append")

    append(0)
    cached, plain = VersionCachedDeltaSource(capacity=2), DeltaTableSource()
    opened: list[int | None] = []
    original = DeltaTableSource.resolve_uri
    monkeypatch.setattr(DeltaTableSource, "resolve_uri",
                        lambda self, uri, version, parts: (opened.append(version) if self is cached else None)
                        or original(self, uri, version, parts))
    first = cached.resolve_uri(path, None, [])
    assert cached.resolve_uri(path, None, []) is first and opened == [0]  # the same version: not read again
    assert first == plain.resolve_uri(path, None, [])
    one_day = cached.resolve_uri(path, None, [{"day": "d0"}])  # other partitions asked for: resolved for them
    assert one_day.file_count == 1 and opened == [0, 0]
    append(10)
    second = cached.resolve_uri(path, None, [])  # a new version: read, and what the plain source reads
    assert second.version == 1 and second == plain.resolve_uri(path, None, [])
    pinned = cached.resolve_uri(path, 0, [])  # a pinned version, evicted from the cache: read again
    assert (pinned.version, pinned.source.delta.files) == (0, first.source.delta.files) and opened[-1] == 0
