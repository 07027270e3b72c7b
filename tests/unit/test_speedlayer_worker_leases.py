"""The leader refreshes its workers' leases in rounds (issue 26): every heartbeat heard since the
last round in one request, and a worker whose lease etcd no longer knows is made to register again."""

from __future__ import annotations

import pytest

from danube_core.errors import MetadataUnavailableError
from danube_core.metadata import Lease
from danube_core.metadata_memory import MemoryMetadataStore
from speedlayer.api.v1 import control_plane_service_pb2 as cp
from speedlayer.master.worker_leases import LeaseRefresher
from speedlayer.master.worker_streams import CLOSE, WorkerSession
from tests.rig import eventually

pytestmark = pytest.mark.unit


class RoundsStore(MemoryMetadataStore):
    """Counts the rounds and the leases each carried."""

    def __init__(self) -> None:
        super().__init__()
        self.rounds: list[list[int]] = []
        self.unavailable = False

    def refresh_leases(self, leases: list[Lease]) -> list[Lease]:
        if self.unavailable:
            raise MetadataUnavailableError("etcd unreachable (test)")
        self.rounds.append(sorted(lease.id for lease in leases))
        return super().refresh_leases(leases)


def session(store: MemoryMetadataStore, worker: str) -> WorkerSession:
    return WorkerSession(tenant="t", worker_id=worker, address="", capacity=cp.WorkerCapacity(),
                         lease=store.grant_lease(30), heartbeat_interval_s=10)


def test_heartbeats_heard_between_rounds_are_refreshed_in_one_request():
    store = RoundsStore()
    refresher = LeaseRefresher(store)  # not started: rounds are run by hand
    sessions = [session(store, f"w{i}") for i in range(5)]
    for s in sessions:
        refresher.heard(s)
    refresher.heard(sessions[0])  # twice in one round: refreshed once
    refresher._run_round()
    assert store.rounds == [sorted(s.lease.id for s in sessions)]
    refresher._run_round()  # nobody heard from since: no request
    assert len(store.rounds) == 1
    store.close()


def test_an_expired_lease_closes_its_session_and_an_unreachable_etcd_closes_none():
    store = RoundsStore()
    alive, gone = session(store, "alive"), session(store, "gone")
    gone.lease.revoke()
    refresher = LeaseRefresher(store)
    refresher.start()
    try:
        refresher.heard(alive)
        refresher.heard(gone)
        eventually(lambda: gone.closed)
        assert gone.outgoing.get_nowait() is CLOSE and not alive.closed
        store.unavailable = True
        refresher.heard(alive)
        refresher._wake.set()
        refresher.refresh([alive])
        assert not alive.closed  # logged; its next heartbeat tries again
    finally:
        refresher.stop()
        store.close()
