"""The query path with real processes: masters, workers and a gateway on a real etcd.

A Delta table admitted to the speed layer is queried through the gateway and compared with
the table's content; a worker killed -9 under a steady query load costs no query (the gateway
retries the other replica); with every master killed, queries still succeed; another tenant's
dataset, limits, deadlines and bad SQL give clear errors.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from speedlayer.clients import QueryClient, delta_request, query
from speedlayer.errors import (
    InvalidQueryError, NotFoundError, QueryTimeoutError, ResultTooLargeError, TenantIsolationError,
    UnauthenticatedError,
)
from speedlayer.records import TenantConfig
from tests.rig import eventually
from devstack import REPO_ROOT
from devstack.speedlayer_cluster import ready_workers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def _admitted(cluster, delta_table, *, workers=("w1", "w2"), rows=3000, tenant="acme"):
    path = delta_table(rows=rows, partitions=3, appends=2)
    cluster.start_master("m1")
    for worker in workers:
        cluster.start_worker(tenant, worker)
    client = cluster.client()
    eventually(lambda: len(client.workers(tenant).workers) == len(workers), deadline_s=60)
    reply = client.admit(delta_request(tenant, "orders", path))
    eventually(lambda: len(ready_workers(client, tenant, "orders", reply.epoch_id)) == 2, deadline_s=90)
    return path, reply.epoch_id


def test_gateway_answers_match_the_delta_table_and_errors_are_clear(cluster_factory, delta_table):
    from deltalake import DeltaTable

    cluster = cluster_factory()
    path, epoch = _admitted(cluster, delta_table)
    cluster.set_tenant("other", TenantConfig())  # known to the gateway from its start
    gateway = cluster.start_gateway(extra={"tokens": {"acme": "s3cret"}})
    expected = DeltaTable(path).to_pyarrow_table()

    with QueryClient(gateway, "acme", token="s3cret") as client:
        whole = eventually(lambda: _try(client.query, "orders", "SELECT * FROM orders ORDER BY id"), deadline_s=30)
        assert whole.sort_by("id").select(["id", "day", "amount"]).to_pylist() == \
            expected.sort_by("id").select(["id", "day", "amount"]).to_pylist()
        point = client.query("orders", "SELECT id, day, amount FROM orders WHERE id = 1234")
        assert point.to_pylist() == [{"id": 1234, "day": "2024-01-02", "amount": 617.0}]
        by_day = client.query("orders", "SELECT day, count(*) AS n FROM orders GROUP BY day ORDER BY day")
        assert by_day.to_pylist() == [{"day": f"2024-01-0{d}", "n": 1000} for d in (1, 2, 3)]
        assert client.query("orders", "SELECT count(*) AS n FROM orders", epoch=epoch).to_pylist() == [{"n": 3000}]
        assert client.query("orders", "SELECT count(*) AS n FROM orders").to_pandas()["n"].tolist() == [3000]

        with pytest.raises(InvalidQueryError, match=r"dataset 'orders'.*no_such_column"):
            client.query("orders", "SELECT no_such_column FROM orders")
        with pytest.raises(ResultTooLargeError, match="max_rows=100"):
            client.query("orders", "SELECT * FROM orders", max_rows=100)
        with pytest.raises(QueryTimeoutError, match="deadline"):
            client.query("orders", "SELECT count(*) FROM orders a, orders b, orders c WHERE (a.id * 7 + b.id * 3 + c.id) % 1000003 = 17",
                         timeout_ms=300)
        with pytest.raises(NotFoundError, match="'missing'"):
            client.query("missing", "SELECT 1")
        with pytest.raises(NotFoundError, match="epoch 'v9-nope'"):
            client.query("orders", "SELECT 1", epoch="v9-nope")

    with pytest.raises(UnauthenticatedError, match="token"):
        query(gateway, "acme", "orders", "SELECT 1 FROM orders", token="wrong")
    # Tenant "other" (known: it has a config; no token configured) is authenticated, but acme's
    # dataset is refused. (A tenant the speed layer has nothing of is an UnknownTenantError.)
    with pytest.raises(TenantIsolationError, match="tenant 'other' may not query dataset 'orders'"):
        query(gateway, "other", "orders", "SELECT * FROM orders")

    cli = subprocess.run(
        [sys.executable, "-m", "speedlayer", "query", "--gateway", gateway, "--tenant", "acme", "--dataset", "orders",
         "--token", "s3cret", "SELECT day, count(*) AS n FROM orders GROUP BY day ORDER BY day"],
        capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert cli.returncode == 0, cli.stderr
    assert "2024-01-01 | 1000" in cli.stdout and "3 row(s) in" in cli.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "speedlayer", "query", "--gateway", gateway, "--tenant", "acme", "--dataset", "orders",
         "--token", "s3cret", "SELECT nope FROM orders"], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert bad.returncode == 1 and "InvalidQueryError" in bad.stderr and "'orders'" in bad.stderr


def _try(call, *args, **kwargs):
    from speedlayer.errors import ReplicaUnavailableError

    try:
        return call(*args, **kwargs)
    except ReplicaUnavailableError:  # the gateway's cache has not seen READY yet
        return None


class QueryLoad:
    """`clients` threads querying steadily, each with its own client id; counts outcomes."""

    def __init__(self, gateway: str, clients: int = 4) -> None:
        self.ok = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(gateway, f"client-{i}")) for i in range(clients)]

    def __enter__(self) -> "QueryLoad":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _run(self, gateway: str, client_id: str) -> None:
        with QueryClient(gateway, "acme", client_id=client_id, timeout_ms=10_000) as client:
            while not self._stop.is_set():
                try:
                    rows = client.query("orders", "SELECT count(*) AS n FROM orders").to_pylist()
                    assert rows == [{"n": 3000}], rows
                    with self._lock:
                        self.ok += 1
                except Exception as exc:  # noqa: BLE001 - every failure is counted and reported
                    with self._lock:
                        self.failures.append(f"{type(exc).__name__}: {exc}")

    def wait_for(self, more: int, deadline_s: float = 60) -> None:
        target = self.ok + more
        eventually(lambda: self.ok >= target, deadline_s=deadline_s)


def test_kill9_worker_and_every_master_under_query_load_loses_no_query(cluster_factory, delta_table):
    cluster = cluster_factory()
    _admitted(cluster, delta_table, workers=("w1", "w2"))
    gateway = cluster.start_gateway()
    eventually(lambda: _try(query, gateway, "acme", "orders", "SELECT 1 AS x FROM orders LIMIT 1"), deadline_s=30)

    from speedlayer.gateway.routing import ReplicaEndpoint, order_replicas

    preferred = order_replicas([ReplicaEndpoint("w1", ""), ReplicaEndpoint("w2", "")], "client-0")[0].worker
    with QueryLoad(gateway) as load:
        load.wait_for(50)
        cluster.kill_worker(f"acme/{preferred}")  # the replica client-0's queries go to
        killed_at = load.ok
        load.wait_for(100)
        cluster.kill_master("m1")
        # Past the workers' lease TTL (3 heartbeats of 1 s): their /workers keys are gone.
        deadline = time.monotonic() + 5
        eventually(lambda: time.monotonic() > deadline and load.ok > killed_at + 150, deadline_s=60)
        load.wait_for(50)
    assert load.failures == [], load.failures[:5]
    assert f"replica {preferred} of orders" in (cluster.root / "gateway-g1.log").read_text()  # it was retried
    assert cluster.metadata.get_prefix(cluster.keys.tenant_workers_prefix("acme")) == []
    assert load.ok > 200
