"""The control plane's scale fixes as pure behaviour (no servers): one index of what every worker
should hold per reconciliation pass, new replicas placed so that balancing has nothing to move,
and a refresh pass that reads no dataset spec unless a dataset is due (issue 26)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from danube_core.metadata_memory import MemoryMetadataStore
from speedlayer.keys import SpeedLayerKeys
from speedlayer.master.desired import DesiredEpochs
from speedlayer.master.placement import EpochPlacement, next_placement, select_evenly
from speedlayer.master.refresh import Refresher
from speedlayer.master.state import ClusterState, ConfigView
from speedlayer.master.strategies import Candidate, PlanSummary, strategy_named
from speedlayer.observability.audit import MemoryAuditLogger
from speedlayer.records import ASSIGNED, EVICTED, R_READY, AssignmentRecord, DatasetSpec, ReplicaRecord

pytestmark = pytest.mark.unit


def record(dataset: str, epoch: str, workers: tuple[str, ...], *, tenant: str = "t", version: int = 0,
           status: str = ASSIGNED, leaving: tuple[str, ...] = ()) -> AssignmentRecord:
    replicas = {w: ReplicaRecord(leaving=w in leaving) for w in workers}
    return AssignmentRecord(tenant=tenant, dataset=dataset, epoch=epoch, request_id=epoch, status=status,
                            version=version, replicas=replicas)


def per_worker_scan(records: list[AssignmentRecord], tenant: str, worker: str) -> dict[str, AssignmentRecord]:
    """What `Reconciler.sync` computed for one worker before the index: a scan of every record."""
    return {f"{r.dataset}/{r.epoch}": r for r in sorted(records, key=lambda r: r.order)
            if r.tenant == tenant and r.live and worker in r.replicas}


def test_desired_epochs_index_equals_a_scan_per_worker():
    records = [record("d1", "e2", ("w1", "w2"), version=2), record("d1", "e1", ("w1",), version=1),
               record("d2", "e3", ("w2", "w3"), leaving=("w3",)), record("d3", "e4", ("w1",), status=EVICTED),
               record("d1", "e5", ("w1",), tenant="other")]
    index = DesiredEpochs.of(records)
    for tenant in ("t", "other"):
        for worker in ("w1", "w2", "w3", "w4"):
            wanted = per_worker_scan(records, tenant, worker)
            assert index.of_worker((tenant, worker)) == wanted
            assert list(index.of_worker((tenant, worker))) == list(wanted)  # oldest first, as before
    assert list(index.of_worker(("t", "w1"))) == ["d1/e1", "d1/e2"]  # the base before its successor
    assert "d3/e4" not in index.of_worker(("t", "w1"))  # EVICTED: dropped, not sent


def candidates(counts: dict[str, int], tenant: str = "t") -> list[Candidate]:
    return [Candidate(worker_id=w, tenant=tenant, epoch_count=n) for w, n in counts.items()]


def test_select_evenly_prefers_workers_below_their_fair_share():
    strategy = strategy_named("rendezvous")
    pool = candidates({"w1": 5, "w2": 5, "w3": 1, "w4": 5})
    for index in range(20):
        chosen = select_evenly(strategy, PlanSummary("t", "d", f"e{index}"), pool, 1)
        assert chosen == ["w3"]  # the fair share after one more is ceil(17/4) = 5: only w3 is below
    chosen = select_evenly(strategy, PlanSummary("t", "d", "e"), pool, 2)
    assert chosen[0] == "w3" and len(set(chosen)) == 2  # the rest from all, by the strategy


def test_select_evenly_keeps_the_strategys_rules():
    strategy = strategy_named("rendezvous")
    pool = candidates({"w1": 0, "w2": 9}) + candidates({"x1": 0}, tenant="other")
    pool.append(Candidate(worker_id="w3", tenant="t", draining=True))
    assert select_evenly(strategy, PlanSummary("t", "d", "e"), pool, 3) == ["w1", "w2"]  # no draining, no other tenant
    assert select_evenly(strategy, PlanSummary("t", "d", "e"), pool, 1, exclude={"w1"}) == ["w2"]


@pytest.mark.parametrize("name", ["rendezvous", "round_robin", "capacity"])
def test_admissions_one_by_one_cause_no_balancing_moves(name):
    """The bug: each new epoch placed by the strategy alone left the replica counts uneven, and
    the reconciler's balancing then moved replicas after most admissions (each a reload)."""
    strategy = strategy_named(name)
    workers = [f"w{i}" for i in range(10)]
    placed: list[EpochPlacement] = []
    moves = 0
    for index in range(200):
        counts = {w: sum(w in e.workers for e in placed) for w in workers}
        plan = PlanSummary("t", f"d{index}", "e")
        chosen = tuple(select_evenly(strategy, plan, candidates(counts), 2))  # what admission does
        placed.append(EpochPlacement(plan, 2, chosen))
        counts = {w: sum(w in e.workers for e in placed) for w in workers}
        changes = next_placement(placed, candidates(counts), set(), strategy)  # the reconciler's next pass
        moves += len(changes)
    assert moves == 0
    counts = {w: sum(w in e.workers for e in placed) for w in workers}
    assert max(counts.values()) - min(counts.values()) <= 1


class CountingStore(MemoryMetadataStore):
    def __init__(self) -> None:
        super().__init__()
        self.prefix_reads: list[str] = []
        self.reads: list[str] = []

    def get_prefix(self, prefix, keys_only=False):
        self.prefix_reads.append(prefix)
        return super().get_prefix(prefix, keys_only=keys_only)

    def get(self, key):
        self.reads.append(key)
        return super().get(key)


class NoTables:
    def latest_version(self, uri: str) -> int:
        self.calls = getattr(self, "calls", 0) + 1
        return 0  # every dataset below holds version 0: nothing to plan


def test_refresh_pass_rereads_no_spec_on_a_change_nobody_waits_for():
    """The bug: every wake of the refresher (every status a worker reported) read all the
    datasets' specs from etcd again, 2,000 keys per change at 2,000 datasets."""
    store, keys = CountingStore(), SpeedLayerKeys("/refresh-scale")
    state = ClusterState(store, keys, lambda: None)
    for index in range(5):
        store.put(keys.dataset_spec("t", f"d{index}"), DatasetSpec("delta", "/tables/shared").to_json())
        state.create_record(replace(record(f"d{index}", f"e{index}", ()), replicas={"w1": ReplicaRecord(state=R_READY)}))
    tables = NoTables()
    refresher = Refresher(state, ConfigView(store, keys), tables, None, MemoryAuditLogger(), "m1",  # type: ignore[arg-type]
                          make_room=lambda tenant, size: None)
    store.prefix_reads.clear()
    refresher.run_once(all_datasets=False)
    assert store.prefix_reads == [] and store.reads == []

    refresher.look_at("t", "d3", "announce")
    refresher.run_once(all_datasets=False)
    assert store.prefix_reads == [] and store.reads == [keys.dataset_spec("t", "d3")]

    refresher.run_once(all_datasets=True)  # a poll reads them all, and the shared table's log once
    assert store.prefix_reads == [keys.tenants_prefix]
    assert tables.calls == 2  # once for d3, once for the five datasets of the poll
    store.close()


def test_a_poll_parses_each_spec_once_per_value(monkeypatch):
    """A poll reads every dataset spec (2,000 at scale, every 5 s): one unchanged since the last
    read is not parsed again; one changed is, and one deleted is forgotten."""
    store, keys = MemoryMetadataStore(), SpeedLayerKeys("/refresh-parse")
    state = ClusterState(store, keys, lambda: None)
    for index in range(3):
        store.put(keys.dataset_spec("t", f"d{index}"), DatasetSpec("delta", "/tables/shared").to_json())
    refresher = Refresher(state, ConfigView(store, keys), NoTables(), None, MemoryAuditLogger(), "m1",  # type: ignore[arg-type]
                          make_room=lambda tenant, size: None)
    parsed: list[str] = []
    original = DatasetSpec.from_json
    monkeypatch.setattr(DatasetSpec, "from_json",
                        classmethod(lambda cls, raw, key: parsed.append(key) or original(raw, key)))
    first = refresher._specs()
    assert len(parsed) == 3 and refresher._specs() == first and len(parsed) == 3
    store.put(keys.dataset_spec("t", "d1"), DatasetSpec("delta", "/tables/other").to_json())
    store.delete(keys.dataset_spec("t", "d2"))
    assert refresher._specs() == {("t", "d0"): first[("t", "d0")], ("t", "d1"): DatasetSpec("delta", "/tables/other")}
    assert parsed[3:] == [keys.dataset_spec("t", "d1")]
    assert refresher._specs_of({("t", "d0"), ("t", "d1")}) == refresher._specs()
    assert len(parsed) == 4
    store.close()
