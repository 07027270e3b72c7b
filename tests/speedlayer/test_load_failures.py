"""A replica whose load FAILED is placed on another worker of the tenant, a bounded number of times.

Real processes: a Delta table on S3 (moto), workers of which some have storage options that
cannot reach the S3 endpoint (a misconfigured `endpoint_url`, as a worker deployed with the
wrong network settings has). The pure record arithmetic is checked first, without servers.
"""

from __future__ import annotations

import pytest

from danube_core.ports import free_port
from speedlayer.clients import delta_request
from speedlayer.master.load_failures import failed_everywhere, replication_target, retire_failed_replicas
from speedlayer.master.placement import EpochPlacement, next_placement
from speedlayer.master.strategies import Candidate, PlanSummary, strategy_named
from speedlayer.records import (
    ASSIGNED, FAILED, R_FAILED, R_READY, AssignmentRecord, GlobalConfig, ReplicaRecord, TenantConfig,
)
from tests.rig import eventually
from devstack.speedlayer_cluster import ready_workers


def _record(**replicas: ReplicaRecord) -> AssignmentRecord:
    return AssignmentRecord(tenant="t", dataset="d", epoch="v1-x", request_id="r", status=ASSIGNED,
                            replication=2, replicas=dict(replicas))


# ---- the record arithmetic ---------------------------------------------------------------------

def test_failed_replica_moves_to_load_failures_with_its_reason():
    record = _record(w1=ReplicaRecord(state=R_READY, rows=5), w2=ReplicaRecord(state=R_FAILED, error="OSError: " + "x" * 900))
    retired = retire_failed_replicas(record)
    assert list(retired.replicas) == ["w1"]
    assert retired.load_failures["w2"].startswith("OSError: ") and len(retired.load_failures["w2"]) == 500
    assert retire_failed_replicas(retired) is None  # nothing left to move


def test_failure_budget_stops_new_attempts_but_not_replacing_a_lost_worker():
    record = _record(w1=ReplicaRecord(state=R_READY))
    spent = AssignmentRecord(**{**record.__dict__, "load_failures": {"w2": "e", "w3": "e"}})
    assert replication_target(record, 2) == 2
    assert replication_target(spent, 2) == 1  # w1 only: no third worker is tried
    assert replication_target(spent, 3) == 2


def test_epoch_fails_only_without_any_replica_left():
    failed_once = AssignmentRecord(**{**_record().__dict__, "load_failures": {"w2": "boom"}})
    assert failed_everywhere(_record(), 3) is None  # never failed: just waiting for workers
    assert failed_everywhere(AssignmentRecord(**{**failed_once.__dict__, "replicas": {"w1": ReplicaRecord()}}), 3) is None
    failed = failed_everywhere(failed_once, 3)
    assert failed.status == FAILED and "w2: boom" in failed.message and "no other eligible worker" in failed.message
    assert "max_load_failures=1 reached" in failed_everywhere(failed_once, 1).message


def test_placement_never_chooses_a_worker_that_failed_the_epoch():
    plan = PlanSummary("t", "d", "v1-x", 10)
    pool = [Candidate(f"w{i}", "t", memory_bytes=1000) for i in range(1, 5)]
    for name in ("round_robin", "rendezvous", "capacity"):
        placed = next_placement([EpochPlacement(plan, 2, ("w1",), frozenset({"w2", "w3"}))], pool, set(),
                                strategy_named(name))
        assert placed == {plan.key: ("w1", "w4")}, name
    # balancing does not move a replica onto an excluded worker either
    others = [EpochPlacement(PlanSummary("t", "d", f"e{i}", 10), 1, ("w1",)) for i in range(3)]
    placed = next_placement([*others, EpochPlacement(plan, 1, ("w1",), frozenset({"w2", "w3", "w4"}))],
                            pool, set(), strategy_named("rendezvous"))
    assert plan.key not in placed


def test_max_load_failures_is_validated_in_the_global_config():
    from danube_core.errors import MetadataError

    with pytest.raises(MetadataError, match="max_load_failures=0"):
        GlobalConfig.from_json(b'{"max_load_failures": 0}', "/config/global")


# ---- real processes ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def s3_table(moto_process):
    """A 3-partition Delta table on moto S3: (uri, master's delta-rs options, good fsspec options)."""
    uri = moto_process.write_orders_table(f"sl-load-failures-{free_port()}", 1200)
    return uri, moto_process.delta_options, {"s3": moto_process.storage_options}


def _unreachable() -> dict:
    """fsspec options whose S3 endpoint is a closed port (one botocore attempt, so it fails fast)."""
    return {"s3": {"key": "testing", "secret": "testing", "config_kwargs": {"retries": {"max_attempts": 1}},
                   "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{free_port()}", "region_name": "us-east-1"}}}


def _epoch(client, tenant: str, epoch: str):
    return client.status(tenant, "orders", epoch).epochs[0]


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_failed_load_is_reassigned_and_fails_only_when_no_worker_is_left(cluster_factory, s3_table):
    uri, delta_options, reachable = s3_table
    # capacity strategy: the worker with the most memory (the misconfigured one) is chosen first
    cluster = cluster_factory(strategy="capacity", delta_storage_options=delta_options)
    cluster.set_global(GlobalConfig(reassign_delay_s=1.0, strategy="capacity", max_load_failures=2))
    cluster.set_tenant("spent", TenantConfig(replication_factor=1))
    cluster.start_master("m1")
    cluster.start_worker("acme", "w-misconfigured", memory_mb=2048, storage_options=_unreachable())
    for worker in ("w-good-1", "w-good-2"):
        cluster.start_worker("acme", worker, memory_mb=1024, storage_options=reachable)
    cluster.start_worker("alone", "w-only", storage_options=_unreachable())
    for worker in ("w-a", "w-b", "w-c"):
        cluster.start_worker("spent", worker, storage_options=_unreachable())
    client = cluster.client()
    eventually(lambda: [len(client.workers(t).workers) for t in ("acme", "alone", "spent")] == [3, 1, 3], 30)

    # 1. one of two replicas fails: it moves to the third worker; the reason stays in the status
    reply = client.admit(delta_request("acme", "orders", uri))
    assert reply.status == "ASSIGNED", reply
    ready = eventually(lambda: (r := ready_workers(client, "acme", "orders", reply.epoch_id)) and len(r) == 2 and r,
                       deadline_s=90)
    assert ready == {"w-good-1": 1200, "w-good-2": 1200}
    epoch = _epoch(client, "acme", reply.epoch_id)
    assert epoch.status == "ASSIGNED"
    failed = {r.worker_id: r.error for r in epoch.replicas if r.state == "FAILED"}
    assert list(failed) == ["w-misconfigured"] and "Could not connect to the endpoint URL" in failed["w-misconfigured"]
    audited = [e for e in cluster.audit_events("replica.FAILED") if e["epoch"] == reply.epoch_id]
    assert [e["detail"]["worker"] for e in audited] == ["w-misconfigured"]
    assert "Could not connect" in audited[0]["detail"]["reason"] and audited[0]["detail"]["failures"] == 1

    # 2. the tenant's only worker fails: no candidate is left, the epoch is FAILED with the reason
    alone = client.admit(delta_request("alone", "orders", uri))
    epoch = eventually(lambda: (e := _epoch(client, "alone", alone.epoch_id)).status == "FAILED" and e, 60)
    assert "no other eligible worker of tenant alone" in epoch.message and "w-only: " in epoch.message
    assert [(r.worker_id, r.state) for r in epoch.replicas] == [("w-only", "FAILED")]

    # 3. bounded: with max_load_failures=2, two of the three workers are tried, never the third
    spent = client.admit(delta_request("spent", "orders", uri))
    epoch = eventually(lambda: (e := _epoch(client, "spent", spent.epoch_id)).status == "FAILED" and e, 60)
    assert "max_load_failures=2 reached" in epoch.message
    assert len(epoch.replicas) == 2 and {r.state for r in epoch.replicas} == {"FAILED"}
    failed_events = [e for e in cluster.audit_events("admission.FAILED") if e["tenant"] in ("alone", "spent")]
    assert sorted(e["tenant"] for e in failed_events) == ["alone", "spent"]
    assert client.quota("spent").memory_used_bytes == 0  # a FAILED epoch holds no quota
