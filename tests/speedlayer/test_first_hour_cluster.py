"""The first hour of a new user on a real cluster (issue 30): one master, ONE worker, a gateway.

With the default replication of 2 and one worker, the admitted epoch stays "1 of 2 replicas
placed": `admit` and `status` say what is missing and how replication is set, and admitting the
same version again with `--replication 1` makes it whole. A tenant typo (`acne` for `acme`) is
refused as an unknown tenant, by the gateway and by `admin status`, naming no other tenant; a
known tenant asking for acme's dataset still gets the isolation error.
"""

from __future__ import annotations

import json
import time

import pytest

from speedlayer.__main__ import main
from speedlayer.clients.query_client import QueryClient
from speedlayer.errors import ReplicaUnavailableError
from speedlayer.records import TenantConfig
from tests.rig import eventually
from devstack.speedlayer_cluster import ready_workers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def run_main(capsys, argv: list[str]) -> tuple[int, str, str, float]:
    """`python -m speedlayer ...` in this process: exit code, stdout, stderr, seconds."""
    started = time.perf_counter()
    code = main(argv)
    elapsed = time.perf_counter() - started
    captured = capsys.readouterr()
    return code, captured.out, captured.err, elapsed


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def _count(gateway: str) -> int | None:
    try:
        with QueryClient(gateway, "acme") as client:
            return client.query("orders", "SELECT count(*) AS n FROM orders").to_pylist()[0]["n"]
    except ReplicaUnavailableError:  # the gateway's cache has not seen READY yet
        return None


def test_one_worker_says_how_to_set_replication_and_a_tenant_typo_is_unknown(cluster_factory, delta_table, capsys):
    path = delta_table(rows=600)
    cluster = cluster_factory()
    cluster.start_master("m1")
    cluster.start_worker("acme", "w1")
    cluster.set_tenant("other", TenantConfig())  # a tenant the speed layer knows, with no dataset
    admin = ["admin", "--masters", ",".join(cluster.master_addresses)]
    client = cluster.client()
    eventually(lambda: len(client.workers("acme").workers) == 1, deadline_s=60)

    # Replication 2 (the default), one worker: what is missing, and where replication is set.
    code, out, err, _ = run_main(capsys, [*admin, "admit", "--tenant", "acme", "--dataset", "orders", "--delta", path])
    assert code == 0, err
    admitted = json.loads(out)
    assert admitted["status"] == "ASSIGNED"
    assert admitted["message"].startswith("1 of 2 replicas placed: tenant acme has 1 worker(s)"), admitted
    epoch = admitted["epoch_id"]
    eventually(lambda: ready_workers(client, "acme", "orders", epoch) == {"w1": 600}, deadline_s=90)
    code, out, err, _ = run_main(capsys, [*admin, "status", "--tenant", "acme", "--dataset", "orders"])
    status = json.loads(out)["epochs"][0]
    assert code == 0 and status["status"] == "ASSIGNED" and status["replication"] == 2
    note = status["message"]
    assert note.startswith("1 of 2 replicas placed: tenant acme has 1 worker(s)"), note
    assert "start 1 more worker(s) of tenant acme" in note
    assert "--replication 1" in note and "replication_factor=1 in /tenants/acme/config" in note
    assert "/config/global" in note

    # A tenant typo in `admin status`: unknown, not "no dataset".
    code, out, err, elapsed = run_main(capsys, [*admin, "status", "--tenant", "acne", "--dataset", "orders"])
    line = one_line(err)
    assert code == 1 and out == "" and elapsed < 5, elapsed
    assert line.startswith("error: NOT_FOUND: unknown tenant 'acne': the speed layer has no workers, datasets or "
                           "configuration for it; check --tenant"), line

    # ... and at the gateway: unknown, naming no tenant; a known tenant keeps the isolation error.
    gateway = cluster.start_gateway()
    assert eventually(lambda: _count(gateway), deadline_s=30) == 600
    query = ["query", "--gateway", gateway, "--dataset", "orders", "SELECT count(*) FROM orders"]
    code, out, err, elapsed = run_main(capsys, [*query, "--tenant", "acne"])
    line = one_line(err)
    assert code == 1 and out == "" and elapsed < 2, elapsed
    assert line.startswith("error: UnknownTenantError: unknown tenant 'acne': the speed layer has no workers, "
                           "datasets or configuration for it; check the tenant's name"), line
    assert "acme" not in line and "other" not in line and "may not query" not in line
    code, out, err, elapsed = run_main(capsys, [*query, "--tenant", "other"])
    line = one_line(err)
    assert code == 1 and elapsed < 2, elapsed
    assert "TenantIsolationError: tenant 'other' may not query dataset 'orders'" in line

    # Following the advice: the same version admitted again with --replication 1 is whole.
    code, out, err, _ = run_main(capsys, [*admin, "admit", "--tenant", "acme", "--dataset", "orders", "--delta", path,
                                          "--replication", "1"])
    again = json.loads(out)
    assert code == 0 and again["epoch_id"] == epoch and again["status"] == "ASSIGNED"
    assert "message" not in again, again  # nothing missing
    code, out, err, _ = run_main(capsys, [*admin, "status", "--tenant", "acme", "--dataset", "orders"])
    status = json.loads(out)["epochs"][0]
    assert status["replication"] == 1 and "message" not in status, status
    assert [(r["worker_id"], r["state"]) for r in status["replicas"]] == [("w1", "READY")]
    assert _count(gateway) == 600
