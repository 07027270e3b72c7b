"""The Admission Controller without servers (memory metadata store, a fake connector):
deterministic epochs, PENDING -> PLANNED -> ASSIGNED with an audit event each, quotas checked
before anything is persisted, idempotency keys, and resuming a record a dead leader left PLANNED."""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pytest

from danube_core.metadata_memory import MemoryMetadataStore
from speedlayer.api.v1 import control_plane_service_pb2 as cp
from speedlayer.clients import delta_request
from speedlayer.errors import InvalidRequestError, PreconditionError, UnsupportedSourceError
from speedlayer.keys import SpeedLayerKeys
from speedlayer.master.admission import AdmissionController
from speedlayer.master.admission_hooks import AdmissionHooks
from speedlayer.master.state import ClusterState, ConfigView
from speedlayer.master.strategies import Candidate, RendezvousStrategy
from speedlayer.observability.audit import MemoryAuditLogger
from speedlayer.records import EVICTED, PLANNED, TenantConfig
from speedlayer.sources import ResolvedTable, TableSource
from tests.rig import eventually

pytestmark = pytest.mark.unit


class FakeDelta(TableSource):
    def __init__(self) -> None:
        self.version = 3

    def resolve(self, source, partitions) -> ResolvedTable:
        files = [cp.DataFile(uri=f"/t/f{i}.parquet", size_bytes=1000, record_count=10) for i in range(4)]
        return ResolvedTable(identity=f"delta:{source.delta_table.table_uri}", version=self.version,
                             source=cp.DataSource(delta=cp.DeltaSource(table_uri="/t", version=self.version, files=files)),
                             arrow_schema=pa.schema([("id", pa.int64())]).serialize().to_pybytes(),
                             total_rows=40, total_bytes=4000, file_count=4)


@pytest.fixture
def rig():
    store = MemoryMetadataStore()
    keys = SpeedLayerKeys("/sl")
    config = ConfigView(store, keys)
    config.start()
    state = ClusterState(store, keys, lambda: None)
    state.load()
    audit, connector = MemoryAuditLogger(), FakeDelta()
    workers = [Candidate("w1", "acme"), Candidate("w2", "acme"), Candidate("w3", "acme"), Candidate("x1", "other")]
    controller = AdmissionController(state, config, {"delta_table": connector}, RendezvousStrategy,
                                     lambda tenant: [w for w in workers if w.tenant == tenant], audit, "m1", lambda: None)
    yield controller, state, audit, connector, store, keys
    state.close()
    config.stop()
    store.close()


def test_admission_is_deterministic_and_audited(rig):
    controller, state, audit, *_ = rig
    first = controller.admit(delta_request("acme", "orders", "/t"))
    assert first.status == "ASSIGNED" and first.epoch_id.startswith("v3-")
    assert [e.kind for e in audit.events] == ["admission.PENDING", "admission.PLANNED", "admission.ASSIGNED",
                                              "dataset.follow"]
    again = controller.admit(delta_request("acme", "orders", "/t"))
    assert (again.epoch_id, again.request_id) == (first.epoch_id, first.request_id)
    assert len(audit.events) == 4  # a retry changes nothing
    record = state.record("acme", "orders", first.epoch_id)
    assert sorted(record.replicas) <= ["w1", "w2", "w3"] and len(record.replicas) == 2
    assert state.get_plan("acme", "orders", first.epoch_id).source.delta.version == 3


def test_idempotency_key_returns_the_same_epoch_after_the_table_moved(rig):
    controller, _, _, connector, *_ = rig
    first = controller.admit(delta_request("acme", "orders", "/t", request_id="req-1"))
    connector.version = 4
    assert controller.admit(delta_request("acme", "orders", "/t", request_id="req-1")).epoch_id == first.epoch_id
    newer = controller.admit(delta_request("acme", "orders", "/t", request_id="req-2"))
    assert newer.epoch_id.startswith("v4-") and newer.epoch_id != first.epoch_id


def test_quota_is_checked_before_anything_is_persisted(rig):
    controller, state, audit, _, store, keys = rig
    store.put(keys.tenant_config("acme"), TenantConfig(memory_quota_bytes=10_000).to_json())
    eventually(lambda: controller._config.tenant("acme").memory_quota_bytes == 10_000)  # hot reload
    # 4000 bytes of Parquet x expansion 2.0 x 2 replicas = 16000 > 10000
    with pytest.raises(PreconditionError, match="tenant acme memory quota"):
        controller.admit(delta_request("acme", "orders", "/t"))
    assert store.get_prefix(keys.assignments_prefix) == [] and audit.events == []
    assert controller.admit(delta_request("acme", "orders", "/t", replication=1)).status == "ASSIGNED"


def test_an_admission_sees_a_tenant_config_written_before_it_without_waiting_for_the_watch(rig):
    controller, _, audit, _, store, keys = rig
    controller._config.stop()  # no watch delivers it: only the admission's own read can
    store.put(keys.tenant_config("acme"), TenantConfig(memory_quota_bytes=10_000).to_json())
    with pytest.raises(PreconditionError, match="tenant acme memory quota"):
        controller.admit(delta_request("acme", "orders", "/t"))
    store.delete(keys.tenant_config("acme"))
    assert controller.admit(delta_request("acme", "orders", "/t")).status == "ASSIGNED"
    assert controller._config.tenant("acme") == TenantConfig()


def test_a_record_left_planned_by_a_dead_leader_is_resumed(rig):
    controller, state, audit, *_ = rig
    first = controller.admit(delta_request("acme", "orders", "/t"))
    state.update_record("acme", "orders", first.epoch_id, lambda r: replace(r, status=PLANNED, replicas={}))
    resumed = controller.admit(delta_request("acme", "orders", "/t"))
    assert (resumed.epoch_id, resumed.status) == (first.epoch_id, "ASSIGNED")


def test_bad_requests(rig):
    controller, *_ = rig
    from speedlayer.api.v1 import management_service_pb2 as mg

    with pytest.raises(InvalidRequestError, match="tenant_id"):
        controller.admit(delta_request("a/b", "orders", "/t"))
    with pytest.raises(InvalidRequestError, match="replication"):
        controller.admit(delta_request("acme", "orders", "/t", replication=99))
    with pytest.raises(InvalidRequestError, match="partitions_to_load"):
        controller.admit(mg.AdmitDatasetRequest(tenant_id="acme", dataset_id="d", partitions_to_load=[mg.PartitionSpec()],
                                                source=mg.DataSourceIdentifier(delta_table=mg.DeltaTable(table_uri="/t"))))
    with pytest.raises(UnsupportedSourceError, match="OLAP"):
        controller.admit(mg.AdmitDatasetRequest(tenant_id="acme", dataset_id="d", source=mg.DataSourceIdentifier(
            olap_table=mg.OlapTable(instance="i", database="d", table="t"))))


def test_the_admission_hooks_see_the_record_planned_before_any_worker_is_assigned(rig):
    """The failover tests kill the leader in this window through a hook passed in (formerly an
    environment switch read in the leader's admission path)."""
    product, state, audit, connector, *_ = rig
    seen = []

    class Recording(AdmissionHooks):
        def after_planned(self, record) -> None:
            stored = state.record(record.tenant, record.dataset, record.epoch)
            seen.append((record.status, stored.status, stored.replicas))

    workers = [Candidate("w1", "acme"), Candidate("w2", "acme")]
    controller = AdmissionController(state, product._config, {"delta_table": connector}, RendezvousStrategy,
                                     lambda tenant: workers, audit, "m1", lambda: None, hooks=Recording())
    assert controller.admit(delta_request("acme", "orders", "/t")).status == "ASSIGNED"
    assert seen == [(PLANNED, PLANNED, {})]


def test_an_evicted_epoch_deleted_while_it_is_admitted_again_is_created_anew(rig, monkeypatch):
    """Admitting an EVICTED epoch again rewrites its record; the reconciler may delete that
    record (its retention over) between the admission's read and its write. The admission
    then creates the record anew; it used to fail on the missing record."""
    controller, state, *_ = rig
    first = controller.admit(delta_request("acme", "orders", "/t"))
    state.update_record("acme", "orders", first.epoch_id, lambda r: replace(r, status=EVICTED, replicas={}))
    update_record = state.update_record

    def deleted_first(tenant, dataset, epoch, change, also=()):
        current = state.record(tenant, dataset, epoch)
        if current is not None and current.status == EVICTED:
            state.delete_record(current)  # the reconciler's retention, just before this write
        return update_record(tenant, dataset, epoch, change, also=also)

    monkeypatch.setattr(state, "update_record", deleted_first)
    again = controller.admit(delta_request("acme", "orders", "/t"))
    assert (again.epoch_id, again.status) == (first.epoch_id, "ASSIGNED")
    assert state.get_plan("acme", "orders", first.epoch_id).source.delta.version == 3
