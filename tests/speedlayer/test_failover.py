"""Acceptance on one host (seed 002 / issue): three masters and three workers, every one a real
process, one etcd of their own. The tests run in order on one cluster, each starting from a
converged state: admission to READY on two workers; kill -9 of the leader during an admission
(the retry returns the same epoch from the new leader); kill -9 of a worker (its epochs READY
elsewhere); SIGSTOP/SIGCONT of a worker past its TTL; an etcd restart.
"""

from __future__ import annotations

import signal

import grpc
import pytest

from speedlayer.clients import delta_request
from speedlayer.records import AssignmentRecord
from tests.rig import eventually
from devstack.speedlayer_cluster import SpeedLayerCluster, ready_workers

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

TENANT, ROWS = "acme", 3000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = SpeedLayerCluster(tmp_path_factory.mktemp("failover"))
    # m1 pauses after PLANNED (its admission hook, passed in by devstack.faults.master), so it can be
    # killed mid-admission; it leads first.
    cluster.start_master("m1", entry=("devstack.faults.master", "--pause-after-planned-s", "4"))
    eventually(lambda: cluster.leader_id() == "m1", deadline_s=20)
    cluster.start_master("m2")
    cluster.start_master("m3")
    for worker in ("w1", "w2", "w3"):
        cluster.start_worker(TENANT, worker)
    yield cluster
    print(cluster.dump_logs())
    cluster.stop()


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    import pyarrow as pa
    from deltalake import write_deltalake

    path = str(tmp_path_factory.mktemp("tables") / "orders")
    ids = range(ROWS)
    write_deltalake(path, pa.table({"id": pa.array(ids, pa.int64()), "day": [f"d{i % 3}" for i in ids]}),
                    partition_by=["day"])
    return path


def two_ready(cluster: SpeedLayerCluster, epoch: str, dataset: str = "orders", deadline_s: float = 60) -> dict[str, int]:
    client = cluster.client()
    return eventually(lambda: (r := ready_workers(client, TENANT, dataset, epoch)) and len(r) == 2 and r,
                      deadline_s=deadline_s)


def record(cluster: SpeedLayerCluster, dataset: str) -> AssignmentRecord | None:
    found = cluster.metadata.get_prefix(cluster.keys.dataset_assignments_prefix(TENANT, dataset))
    return AssignmentRecord.from_json(found[0][1], found[0][0]) if found else None


def test_leader_killed_during_admission_retry_returns_same_epoch(cluster, table):
    client = cluster.client()
    eventually(lambda: len(client.workers(TENANT).workers) == 3, deadline_s=30)
    request = delta_request(TENANT, "orders", table, request_id="admit-orders-1")
    import threading

    outcome: dict = {}

    def first_try() -> None:
        try:
            outcome["reply"] = cluster.client(deadline_s=0).admit(request)
        except grpc.RpcError as exc:
            outcome["error"] = exc.code()

    caller = threading.Thread(target=first_try)
    caller.start()
    planned = eventually(lambda: (r := record(cluster, "orders")) and r.status == "PLANNED" and r, deadline_s=20)
    cluster.kill_master("m1")
    caller.join(20)
    assert outcome.get("error") == grpc.StatusCode.UNAVAILABLE, outcome

    retry = cluster.client().admit(request)
    # The same epoch. ASSIGNED at once when the new leader still sees the workers registered;
    # PLANNED when their (3 s) leases lapsed before it took over and they have not reconnected
    # yet: the new leader then assigns it as they register.
    assert retry.epoch_id == planned.epoch and retry.status in ("ASSIGNED", "PLANNED"), retry
    assert cluster.leader_id() in ("m2", "m3")
    assert set(two_ready(cluster, retry.epoch_id).values()) == {ROWS}


def test_follower_names_the_leader_and_a_new_leader_keeps_placement(cluster, table):
    from speedlayer.api.v1 import management_service_pb2_grpc as mg_grpc
    from speedlayer.observability.audit import read_audit_log

    epoch = record(cluster, "orders").epoch
    before = two_ready(cluster, epoch)
    leader = cluster.leader_id()
    follower = next(m for m in cluster.masters if m != leader)
    with grpc.insecure_channel(f"127.0.0.1:{cluster.masters[follower][1]}") as channel:
        with pytest.raises(grpc.RpcError) as caught:
            mg_grpc.ManagementServiceStub(channel).AdmitDataset(delta_request(TENANT, "orders", table), timeout=10)
    hints = dict(caught.value.trailing_metadata())
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert hints["leader-address"] == f"127.0.0.1:{cluster.masters[leader][1]}" and int(hints["retry-after-ms"]) > 0

    cluster.kill_master(leader)
    new = eventually(lambda: (m := cluster.leader_id()) not in (None, leader) and m, deadline_s=20)
    cluster.start_master(leader)  # back, as a follower
    eventually(lambda: len(cluster.client().workers(TENANT).workers) == 3, deadline_s=30)
    assert two_ready(cluster, epoch) == before
    moved = [e for e in read_audit_log(str(cluster.root / f"speedlayer-audit-{new}.jsonl"))
             if e["kind"] == "assignment.moved"]
    assert moved == []  # the new leader reconciled with what workers hold


def test_worker_killed_its_epochs_ready_elsewhere(cluster, table):
    epoch = record(cluster, "orders").epoch
    before = two_ready(cluster, epoch)
    victim = sorted(before)[0]
    cluster.kill_worker(f"{TENANT}/{victim}")
    after = eventually(lambda: (r := two_ready(cluster, epoch)) and victim not in r and r, deadline_s=60)
    assert set(after.values()) == {ROWS}
    cluster.start_worker(TENANT, victim)  # back for the next tests
    eventually(lambda: len(cluster.client().workers(TENANT).workers) == 3, deadline_s=30)


def test_stopped_worker_past_its_ttl_is_replaced_then_rejoins(cluster, table):
    epoch = record(cluster, "orders").epoch
    before = two_ready(cluster, epoch)
    victim = sorted(before)[-1]
    process = cluster.workers[f"{TENANT}/{victim}"]
    process.send_signal(signal.SIGSTOP)
    try:
        eventually(lambda: (r := two_ready(cluster, epoch)) and victim not in r, deadline_s=60)
    finally:
        process.send_signal(signal.SIGCONT)
    client = cluster.client()
    eventually(lambda: victim in {w.worker_id for w in client.workers(TENANT).workers}, deadline_s=30)
    assert set(two_ready(cluster, epoch).values()) == {ROWS}


def test_etcd_restart(cluster, table, tmp_path):
    epoch = record(cluster, "orders").epoch
    cluster.restart_etcd()
    client = cluster.client(deadline_s=60)
    eventually(lambda: len(client.workers(TENANT).workers) == 3, deadline_s=60)
    assert set(two_ready(cluster, epoch).values()) == {ROWS}
    reply = client.admit(delta_request(TENANT, "orders_day0", table, partitions=[{"day": "d0"}]))
    assert set(two_ready(cluster, reply.epoch_id, dataset="orders_day0").values()) == {ROWS // 3}
