"""A followed dataset whose newest epoch was left PENDING by an admission that stopped half way
(etcd refused the write of its plan, or the leader died): after `STALLED_ADMISSION_S` with no
admission placing it, the refresh evicts it and plans the table's latest version again. Before,
the dataset waited on it for good (the soak: version 13 answered for the last 20 minutes of a
run whose table reached version 45)."""

from __future__ import annotations

import pytest

from danube_core.metadata_memory import MemoryMetadataStore
from speedlayer.keys import SpeedLayerKeys
from speedlayer.master import refresh as refresh_module
from speedlayer.master.refresh import Refresher
from speedlayer.master.state import ClusterState
from speedlayer.observability.audit import MemoryAuditLogger
from speedlayer.records import EVICTED, PENDING, AssignmentRecord, DatasetSpec

pytestmark = pytest.mark.unit

SPEC = DatasetSpec("delta", "/tables/orders")


class Table:
    """The followed table at version 14 (the fake resolves nothing the refresh reads further)."""

    def latest_version(self, uri: str) -> int:
        return 14

    def resolve_uri(self, uri: str, version: int, wanted: list) -> str:
        return f"{uri}@{version}"

    def operations(self, uri: str, after: int, latest: int) -> list[str]:
        return []


class Admission:
    def __init__(self) -> None:
        self.planned: list[str] = []

    def plan_refresh(self, tenant, dataset, spec, resolved, base, change, detail):  # noqa: ANN001
        self.planned.append(resolved)
        return None


def _refresher(state: ClusterState, admission: Admission, audit: MemoryAuditLogger) -> Refresher:
    return Refresher(state, None, Table(), admission, audit, "m1",  # type: ignore[arg-type]
                     make_room=lambda tenant, size: None)


@pytest.fixture
def pending() -> tuple[ClusterState, AssignmentRecord]:
    store = MemoryMetadataStore()
    state = ClusterState(store, SpeedLayerKeys("/stalled"), lambda: None)
    record = state.create_record(AssignmentRecord(tenant="t", dataset="orders", epoch="v14-a", request_id="r",
                                                  status=PENDING, version=14))
    return state, record


def test_a_stalled_pending_epoch_is_evicted_and_its_version_planned_again(pending, monkeypatch):
    state, record = pending
    monkeypatch.setattr(refresh_module, "STALLED_ADMISSION_S", 0.0)
    admission, audit = Admission(), MemoryAuditLogger()
    assert _refresher(state, admission, audit).refresh(("t", "orders"), SPEC, "poll") is False
    assert state.record("t", "orders", "v14-a").status == EVICTED
    assert "stalled" in state.record("t", "orders", "v14-a").message
    assert admission.planned == ["/tables/orders@14"]
    assert [(e.kind, e.detail["reason"]) for e in audit.events] == [("epoch.EVICTED", "stalled")]


def test_a_pending_epoch_within_the_wait_or_being_placed_is_waited_on(pending, monkeypatch):
    state, record = pending
    admission, audit = Admission(), MemoryAuditLogger()
    refresher = _refresher(state, admission, audit)
    assert refresher.refresh(("t", "orders"), SPEC, "poll") is True  # 30 s have not passed
    monkeypatch.setattr(refresh_module, "STALLED_ADMISSION_S", 0.0)
    with state.placing([("t", "orders", "v14-a")]):  # an admission is on it
        assert refresher.refresh(("t", "orders"), SPEC, "poll") is True
    assert state.record("t", "orders", "v14-a").status == PENDING and admission.planned == []
