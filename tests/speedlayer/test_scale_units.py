"""The control plane's scale fixes as pure behaviour (no servers): one index of what every worker
should hold per reconciliation pass, new replicas placed so that balancing has nothing to move,
and a refresh pass that reads no dataset spec from etcd and, polling, looks only at the
datasets of a table that moved (issue 26)."""

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
from tests.rig import eventually

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
    def __init__(self) -> None:
        self.version = 0  # every dataset below holds version 0: nothing to plan
        self.calls = 0

    def latest_version(self, uri: str) -> int:
        self.calls += 1
        return self.version


def test_refresh_pass_reads_no_spec_from_etcd():
    """The bug: every wake of the refresher (every status a worker reported) read all the
    datasets' specs from etcd again, 2,000 keys per change at 2,000 datasets; then every poll
    still did (every 5 s). The specs are the watched config view's."""
    store, keys = CountingStore(), SpeedLayerKeys("/refresh-scale")
    state = ClusterState(store, keys, lambda: None)
    for index in range(5):
        store.put(keys.dataset_spec("t", f"d{index}"), DatasetSpec("delta", "/tables/shared").to_json())
        state.create_record(replace(record(f"d{index}", f"e{index}", ()), replicas={"w1": ReplicaRecord(state=R_READY)}))
    config = ConfigView(store, keys)
    config.start()
    tables = NoTables()
    refresher = Refresher(state, config, tables, None, MemoryAuditLogger(), "m1",  # type: ignore[arg-type]
                          make_room=lambda tenant, size: None)
    store.prefix_reads.clear()
    store.reads.clear()
    refresher.run_once(all_datasets=False)
    refresher.look_at("t", "d3", "announce")
    refresher.run_once(all_datasets=False)
    refresher.run_once(all_datasets=True)  # a poll: the shared table's log once
    assert store.prefix_reads == [] and store.reads == []
    assert tables.calls == 2  # once for d3, once for the five datasets of the poll
    config.stop()
    store.close()


def test_a_poll_looks_only_at_datasets_of_a_table_that_moved(monkeypatch):
    """A poll at 2,000 datasets of one table looked at each of them (records grouped, versions
    compared) every 5 s on the leader. Now a dataset is looked at by a poll when its table's
    latest version moved since the last poll, when its spec is new, or when its last look failed."""
    store, keys = MemoryMetadataStore(), SpeedLayerKeys("/refresh-moved")
    state = ClusterState(store, keys, lambda: None)
    for index in range(3):
        store.put(keys.dataset_spec("t", f"d{index}"), DatasetSpec("delta", "/tables/shared").to_json())
    store.put(keys.dataset_spec("t", "other"), DatasetSpec("delta", "/tables/other").to_json())
    config = ConfigView(store, keys)
    config.start()
    tables = NoTables()
    refresher = Refresher(state, config, tables, None, MemoryAuditLogger(), "m1",  # type: ignore[arg-type]
                          make_room=lambda tenant, size: None)
    looked: list[tuple[str, str]] = []
    monkeypatch.setattr(refresher, "refresh", lambda key, spec, trigger, records=None: looked.append(key) or False)
    refresher.run_once(all_datasets=True)  # a new leader's first poll: everything
    assert sorted(looked) == [("t", "d0"), ("t", "d1"), ("t", "d2"), ("t", "other")]
    looked.clear()
    refresher.run_once(all_datasets=True)  # nothing moved
    assert looked == []
    store.put(keys.dataset_spec("t", "d3"), DatasetSpec("delta", "/tables/shared").to_json())
    eventually(lambda: config.spec("t", "d3"))  # through the config view's watch
    refresher.run_once(all_datasets=True)  # a spec new since the last poll
    assert looked == [("t", "d3")]
    looked.clear()
    tables.version = 1  # both tables moved (one log handle per URI in the fake)
    refresher.run_once(all_datasets=True)
    assert sorted(looked) == [("t", "d0"), ("t", "d1"), ("t", "d2"), ("t", "d3"), ("t", "other")]
    looked.clear()
    store.delete(keys.dataset_spec("t", "d1"))
    eventually(lambda: config.spec("t", "d1") is None)
    refresher.look_at("t", "d1", "announce")  # no spec any more: not followed
    refresher.run_once(all_datasets=True)
    assert looked == []
    config.stop()
    store.close()


def test_a_pass_syncs_only_the_workers_whose_epochs_or_reports_changed(monkeypatch):
    """The bug: every reconciliation pass synced all 100 workers, though an admission changes
    what two of them hold. A worker is synced when its epochs changed, when it reported something
    (`held` changed), or when what is superseded changed; the plans sent are the same as before."""
    from speedlayer.api.v1 import control_plane_service_pb2 as cp
    from speedlayer.master.reconciler import Reconciler
    from speedlayer.master.strategies import RendezvousStrategy
    from speedlayer.master.worker_streams import StreamRegistry, WorkerSession
    from speedlayer.records import GlobalConfig, WorkerRecord

    store, keys = MemoryMetadataStore(), SpeedLayerKeys("/sync-changed")
    config = ConfigView(store, keys)
    config.global_config = GlobalConfig(reassign_delay_s=0.0, replication_factor=1)
    for worker in ("w1", "w2", "w3"):
        store.put(keys.worker("t", worker), WorkerRecord(address="x", memory_bytes=0, cpu_cores=1,
                                                         master_id="m1").to_json())
    state = ClusterState(store, keys, lambda: None)
    state.load()
    registry = StreamRegistry()
    sessions = {w: WorkerSession(tenant="t", worker_id=w, address="x", capacity=cp.WorkerCapacity(),
                                 lease=store.grant_lease(30), heartbeat_interval_s=1) for w in ("w1", "w2", "w3")}
    for session in sessions.values():
        registry.add(session)
    reconciler = Reconciler(state, registry, config, RendezvousStrategy, MemoryAuditLogger(), "m1")
    synced: list[str] = []
    original = Reconciler.sync
    monkeypatch.setattr(Reconciler, "sync", lambda self, session, index=None: synced.append(session.worker_id)
                        or original(self, session, index))

    def admitted(dataset: str, epoch: str, worker: str) -> None:
        state.put_plan(cp.LoadPlan(tenant_id="t", dataset_id=dataset, epoch_id=epoch))
        state.create_record(replace(record(dataset, epoch, (worker,)), replication=1))

    admitted("d1", "e1", "w1")
    reconciler.run_once()
    assert sorted(synced) == ["w1", "w2", "w3"]  # the first pass: every session is new
    synced.clear()
    reconciler.run_once()
    assert synced == []  # nothing changed
    admitted("d2", "e2", "w2")
    reconciler.run_once()
    assert synced == ["w2"] and "d2/e2" in sessions["w2"].sent
    synced.clear()
    sessions["w3"].held["d9/e9"] = R_READY  # a report of something it should not hold
    sessions["w3"].reported = True
    reconciler.run_once()
    assert synced == ["w3"] and "d9/e9" not in sessions["w3"].held  # dropped
    synced.clear()
    state.put_plan(cp.LoadPlan(tenant_id="t", dataset_id="d1", epoch_id="e3"))
    state.create_record(replace(record("d1", "e3", (), version=1), replication=1,  # served: e1 superseded
                                replicas={"w1": ReplicaRecord(state=R_READY)}))
    reconciler.run_once()
    assert state.superseded() == {("t", "d1", "e1")} and sorted(synced) == ["w1", "w2", "w3"]
    state.close()
    store.close()


def test_a_pass_leaves_an_epoch_to_the_admission_placing_it():
    """The bug: a pass woken while an admission had its epoch PLANNED without replicas saw an
    epoch short of replicas and ran a full placement (O(epochs), holding the GIL the admission
    waited for), racing the admission's own assignment. Left alone meanwhile; placed by the
    reconciler if the admission leaves it unplaced."""
    from speedlayer.master.reconciler import Reconciler
    from speedlayer.master.strategies import RendezvousStrategy
    from speedlayer.master.worker_streams import StreamRegistry
    from speedlayer.records import PLANNED, GlobalConfig, WorkerRecord

    store, keys = MemoryMetadataStore(), SpeedLayerKeys("/placing")
    config = ConfigView(store, keys)
    config.global_config = GlobalConfig(reassign_delay_s=0.0, replication_factor=1)
    store.put(keys.worker("t", "w1"), WorkerRecord(address="x", memory_bytes=0, cpu_cores=1, master_id="m1").to_json())
    state = ClusterState(store, keys, lambda: None)
    state.load()
    reconciler = Reconciler(state, StreamRegistry(), config, RendezvousStrategy, MemoryAuditLogger(), "m1")
    with state.placing([("t", "d1", "e1")]):
        state.create_record(replace(record("d1", "e1", (), status=PLANNED), replication=1))
        reconciler.run_once()
        assert state.record("t", "d1", "e1").replicas == {}  # the admission's to place
    reconciler.run_once()  # the admission left it unplaced: the reconciler's again
    assert list(state.record("t", "d1", "e1").replicas) == ["w1"]
    state.close()
    store.close()
