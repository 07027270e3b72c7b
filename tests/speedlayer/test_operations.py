"""Operations as a user runs them: the admin CLI (JSON out), drain, Prometheus metrics, the
audit trail, and a worker restarted within the reassignment delay keeping its epochs."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from danube_core.ports import free_port
from speedlayer.clients import delta_request
from speedlayer.observability.audit import read_audit_log
from tests.rig import eventually
from devstack import REPO_ROOT
from devstack.speedlayer_cluster import ready_workers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def admin(cluster, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "speedlayer", "admin", "--masters", ",".join(cluster.master_addresses),
                           *args], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT,
                          env=cluster._env())
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_admin_cli_drain_metrics_and_audit(cluster_factory, delta_table):
    path = delta_table(rows=1200)
    cluster = cluster_factory()
    metrics_port = free_port()
    cluster.start_master("m1", env={"SPEEDLAYER_MASTER__METRICS_PORT": str(metrics_port)})
    for worker in ("w1", "w2"):
        cluster.start_worker("acme", worker)
    eventually(lambda: len(admin(cluster, "workers", "--tenant", "acme").get("workers", [])) == 2, deadline_s=30)

    assert admin(cluster, "quota", "--tenant", "acme", "--memory-bytes", "1000000000")["memory_quota_bytes"] == "1000000000"
    admitted = admin(cluster, "admit", "--tenant", "acme", "--dataset", "orders", "--delta", path, "--request-id", "r1")
    assert admitted["status"] == "ASSIGNED"
    epoch = admitted["epoch_id"]

    def both_ready() -> bool:
        replicas = admin(cluster, "status", "--tenant", "acme", "--dataset", "orders")["epochs"][0]["replicas"]
        return sorted((r["worker_id"], r["state"], r["rows"]) for r in replicas) == [
            ("w1", "READY", "1200"), ("w2", "READY", "1200")]

    eventually(both_ready, deadline_s=60)

    admin(cluster, "drain", "--tenant", "acme", "--worker", "w1")
    client = cluster.client()
    eventually(lambda: ready_workers(client, "acme", "orders", epoch) == {"w2": 1200}, deadline_s=30)
    assert cluster.workers["acme/w1"].wait(30) == 0  # drained, it leaves

    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    assert "master_leader_status 1.0" in text
    assert 'master_workers_registered_total{tenant="acme"}' in text
    assert "master_data_assignment_duration_seconds_count 1.0" in text
    assert 'etcd_client_latency_seconds_count{op="compare_and_put"}' in text
    # what the dashboards and alerts read, from the real leader: its epochs by status, every
    # status present (zeros too), and the drained w1 that left is not counted as lost
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    epochs = {dict(labels)["status"]: value for (name, labels), value in samples.items()
              if name == "master_epochs" and dict(labels).get("tenant") == "acme"
              and dict(labels).get("dataset") == "orders"}
    assert {status for status, count in epochs.items() if count} == {"ASSIGNED"} and epochs["ASSIGNED"] == 1.0
    assert epochs.get("FAILED") == 0.0
    assert samples[("master_workers_lost_total", (("tenant", "acme"),))] == 0.0
    assert samples[("master_leader_status", ())] == 1.0

    kinds = [e["kind"] for e in read_audit_log(str(cluster.root / "speedlayer-audit-m1.jsonl"))]
    assert kinds[:1] == ["leader.elected"]
    assert ["admission.PENDING", "admission.PLANNED", "admission.ASSIGNED"] == [k for k in kinds if k.startswith("admission.")]
    assert "assignment.moved" in kinds


def test_worker_back_within_the_delay_keeps_its_epochs(cluster_factory, delta_table):
    path = delta_table(rows=600)
    cluster = cluster_factory(reassign_delay_s=30.0)
    cluster.start_master("m1")
    for worker in ("w1", "w2", "w3"):
        cluster.start_worker("acme", worker)
    client = cluster.client()
    eventually(lambda: len(client.workers("acme").workers) == 3, deadline_s=30)
    epoch = client.admit(delta_request("acme", "orders", path)).epoch_id
    before = eventually(lambda: (r := ready_workers(client, "acme", "orders", epoch)) and len(r) == 2 and r, deadline_s=60)
    victim = sorted(before)[0]
    cluster.kill_worker(f"acme/{victim}")
    cluster.start_worker("acme", victim)
    # The restarted process holds nothing, so READY there means it loaded the plan again (its
    # not-READY moment can be shorter than any poll, so it is not waited for); nothing moves to
    # the third worker.
    eventually(lambda: ready_workers(client, "acme", "orders", epoch) == before, deadline_s=60)
    kinds = [e["kind"] for e in read_audit_log(str(cluster.root / "speedlayer-audit-m1.jsonl"))]
    assert "assignment.moved" not in kinds
