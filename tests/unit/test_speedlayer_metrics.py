"""The speed layer's dashboard and alert metrics without servers: epochs by status per tenant and
dataset (`master_epochs`, the leader's view, gone when it is deposed) and workers lost
(`master_workers_lost_total`, counted when a registered worker's lease ends without a drain)."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from danube_core.metadata_memory import MemoryMetadataStore
from speedlayer.keys import SpeedLayerKeys
from speedlayer.master.reconciler import Reconciler, epoch_counts
from speedlayer.master.state import ClusterState, ConfigView
from speedlayer.master.strategies import RendezvousStrategy
from speedlayer.master.worker_streams import StreamRegistry
from speedlayer.observability.audit import MemoryAuditLogger
from speedlayer.observability.metrics import forget_leader_view, set_epoch_counts
from speedlayer.records import ASSIGNED, FAILED, AssignmentRecord, WorkerRecord
from tests.rig import eventually

pytestmark = pytest.mark.unit


def epochs(tenant: str, dataset: str, status: str) -> float | None:
    return REGISTRY.get_sample_value("master_epochs", {"tenant": tenant, "dataset": dataset, "status": status})


def lost(tenant: str) -> float | None:
    return REGISTRY.get_sample_value("master_workers_lost_total", {"tenant": tenant})


def record(dataset: str, epoch: str, status: str, tenant: str = "metrics-t") -> AssignmentRecord:
    return AssignmentRecord(tenant=tenant, dataset=dataset, epoch=epoch, request_id=epoch, status=status)


def test_epoch_counts_every_status_of_each_dataset_and_drop_deleted_datasets():
    records = [record("orders", "e1", ASSIGNED), record("orders", "e2", FAILED), record("clicks", "e3", ASSIGNED)]
    counts = epoch_counts(records)
    assert counts[("metrics-t", "orders", ASSIGNED)] == 1 and counts[("metrics-t", "orders", FAILED)] == 1
    assert counts[("metrics-t", "clicks", FAILED)] == 0  # zeros too: a retired FAILED epoch reads 0, not absent
    assert len(counts) == 2 * 5

    set_epoch_counts(counts)
    assert epochs("metrics-t", "orders", FAILED) == 1.0
    assert epochs("metrics-t", "clicks", ASSIGNED) == 1.0

    set_epoch_counts(epoch_counts(records[:1]))  # clicks deleted, the FAILED epoch of orders retired
    assert epochs("metrics-t", "orders", FAILED) == 0.0
    assert epochs("metrics-t", "clicks", ASSIGNED) is None

    forget_leader_view()  # deposed: a follower reports no epochs
    assert epochs("metrics-t", "orders", ASSIGNED) is None


def test_the_leaders_reconciler_exports_its_epochs_on_every_pass():
    store = MemoryMetadataStore()
    keys = SpeedLayerKeys("/metrics-reconciler")
    config = ConfigView(store, keys)
    state = ClusterState(store, keys, lambda: None)
    state.load()
    try:
        state.create_record(record("events", "e1", FAILED, tenant="reconciled-t"))
        Reconciler(state, StreamRegistry(), config, RendezvousStrategy, MemoryAuditLogger(), "m1").run_once()
        assert epochs("reconciled-t", "events", FAILED) == 1.0
        assert epochs("reconciled-t", "events", ASSIGNED) == 0.0
    finally:
        forget_leader_view()
        state.close()
        store.close()


def test_a_worker_whose_lease_ends_counts_as_lost_unless_it_was_drained():
    store = MemoryMetadataStore()
    keys = SpeedLayerKeys("/metrics-test")
    tenant = "lost-t"
    worker = WorkerRecord(address="127.0.0.1:1", memory_bytes=1 << 30, cpu_cores=1, master_id="m1").to_json()
    store.put(keys.worker(tenant, "w1"), worker)
    state = ClusterState(store, keys, lambda: None)
    state.load()
    try:
        assert lost(tenant) == 0.0  # exported before the first loss, so increase() sees it
        store.put(keys.worker(tenant, "w2"), worker)
        eventually(lambda: (tenant, "w2") in state.workers)

        store.delete(keys.worker(tenant, "w1"))  # its lease expired
        eventually(lambda: lost(tenant) == 1.0)

        store.put(keys.drain(tenant, "w2"), b"{}")
        eventually(lambda: (tenant, "w2") in state.draining)
        store.delete(keys.worker(tenant, "w2"))  # drained, then it left
        eventually(lambda: (tenant, "w2") not in state.workers)
        assert lost(tenant) == 1.0
    finally:
        state.close()
        store.close()


def test_lost_worker_warning_is_logged_for_lost_workers_not_drained_ones(caplog):
    """Regression: the "lost (its lease expired)" warning sat in the drained branch, so it named
    every drained worker that left and never a lost one."""
    store = MemoryMetadataStore()
    keys = SpeedLayerKeys("/lost-warning-test")
    tenant = "warned-t"
    worker = WorkerRecord(address="127.0.0.1:1", memory_bytes=1 << 30, cpu_cores=1, master_id="m1").to_json()
    for name in ("w1", "w2"):
        store.put(keys.worker(tenant, name), worker)
    state = ClusterState(store, keys, lambda: None)
    state.load()
    caplog.set_level("INFO", logger="speedlayer.master.state")
    try:
        store.put(keys.drain(tenant, "w2"), b"{}")
        eventually(lambda: (tenant, "w2") in state.draining)
        store.delete(keys.worker(tenant, "w2"))  # drained, then it left
        eventually(lambda: (tenant, "w2") not in state.workers)
        store.delete(keys.worker(tenant, "w1"))  # its lease expired
        eventually(lambda: (tenant, "w1") not in state.workers)

        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert warnings == [f"worker {tenant}/w1 lost (its lease expired)"]
        assert f"worker {tenant}/w2 left after its drain" in caplog.text
    finally:
        state.close()
        store.close()
