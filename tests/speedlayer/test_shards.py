"""Sharded epochs end to end: a table bigger than any worker, served through shards and merged at
the gateway (issue 26).

One cluster for the module (real processes: a master, four workers of 3 MiB, a gateway), a
partitioned Delta table of 8 days whose estimated memory (the expansion factor is raised so that
a few thousand rows weigh ~3.6 MiB) exceeds every worker's; the tenant's `shard_max_bytes` splits
it into four shards of two days each, replicated twice. Answers are compared with DuckDB reading
the same Delta version straight from its files (deltalake), not through the speed layer. The
tenant's gather limit holds any two shards but not three: a shape that does not decompose is
gathered and run at the gateway when its WHERE clause leaves two shards, refused otherwise.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import duckdb
import grpc
import pyarrow as pa
import pytest

from danube_core.ports import free_port
from speedlayer.clients import QueryClient, delta_request
from speedlayer.errors import InvalidQueryError
from speedlayer.records import AssignmentRecord, GlobalConfig, TenantConfig
from tests.rig import eventually
from devstack import REPO_ROOT
from devstack.speedlayer_cluster import SpeedLayerCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TENANT, DAYS, ROWS = "acme", 8, 4000
WORKER_MB = 3
ESTIMATE = int(3.6 * 1024 * 1024)  # what the table should weigh in memory: more than one worker's 3 MiB
SHARD_MAX = int(ESTIMATE / 4 * 1.15)
GATHER_MAX = int(ESTIMATE * 0.6)  # >= 2 x SHARD_MAX (any two shards), < the table less its largest shard


def _write(path: str, rows: range, mode: str = "append") -> None:
    from deltalake import write_deltalake

    write_deltalake(path, pa.table({
        "id": pa.array(rows, pa.int64()),
        "day": [f"2024-01-{i % DAYS + 1:02d}" for i in rows],
        "amount": pa.array([float(i % 97) for i in rows], pa.float64()),
    }), partition_by=["day"], mode=mode)


def _parquet_bytes(path: str) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*.parquet"))


@pytest.fixture(scope="module")
def shards(tmp_path_factory, etcd_endpoint):
    """(cluster, gateway, metrics port, table path, epoch of version 0)."""
    root = tmp_path_factory.mktemp("shards")
    table = str(root / "orders")
    _write(table, range(ROWS))
    expansion = ESTIMATE / _parquet_bytes(table)
    cluster = SpeedLayerCluster(tmp_path_factory.mktemp("shards-cluster"), etcd_endpoint=etcd_endpoint)
    cluster.set_global(GlobalConfig(reassign_delay_s=1.0, memory_expansion_factor=expansion, max_load_failures=2))
    cluster.set_tenant(TENANT, TenantConfig(shard_max_bytes=SHARD_MAX, gather_max_bytes=GATHER_MAX))
    cluster.set_tenant("narrow", TenantConfig(shard_max_bytes=ESTIMATE // 10))  # 8 days: 8 shards
    try:
        cluster.start_master("m1")
        for index in range(4):
            cluster.start_worker(TENANT, f"w{index}", memory_mb=WORKER_MB)
        cluster.start_worker("narrow", "n0", memory_mb=WORKER_MB)
        metrics_port = free_port()
        gateway = cluster.start_gateway(extra={"metrics_port": metrics_port})
        client = cluster.client()
        eventually(lambda: [len(client.workers(t).workers) for t in (TENANT, "narrow")] == [4, 1], 30)
        reply = client.admit(delta_request(TENANT, "orders", table, version=0))
        yield cluster, gateway, metrics_port, table, reply
    finally:
        cluster.stop()


def _direct(table: str, version: int, sql: str) -> list[dict]:
    """`sql` on the Delta version read straight from its files (the reference answer)."""
    from deltalake import DeltaTable

    connection = duckdb.connect()
    connection.register("orders", DeltaTable(table, version=version).to_pyarrow_table())
    return connection.sql(sql).to_arrow_table().to_pylist()


def _query(gateway: str, sql: str) -> list[dict]:
    with QueryClient(gateway, TENANT, token=None, client_id="shards-test") as client:
        return client.query("orders", sql, timeout_ms=20_000).to_pylist()


def _served(cluster: SpeedLayerCluster, epoch: str):
    status = cluster.client().status(TENANT, "orders", epoch).epochs[0]
    return status if status.message.startswith("sharded into") and " 4 of 4 READY" in status.message else None


EXACT = [
    "SELECT day, count(*) AS n, sum(amount) AS total, min(id), max(id), avg(amount) AS mean "
    "FROM orders GROUP BY day ORDER BY day",
    "SELECT count(*), sum(amount) FROM orders WHERE amount > 50 AND id % 3 = 0",       # not partition columns
    "SELECT day, count(*) FROM orders WHERE day IN ('2024-01-02', '2024-01-07') GROUP BY day ORDER BY day",
    "SELECT id, amount FROM orders ORDER BY amount DESC, id LIMIT 7 OFFSET 3",
    "SELECT amount > 48 AS high, count(*) AS n FROM orders GROUP BY amount > 48 ORDER BY high",
]


def test_a_table_bigger_than_any_worker_is_sharded_and_answered_exactly(shards):
    cluster, gateway, metrics_port, table, reply = shards
    assert reply.status == "ASSIGNED", reply
    status = eventually(lambda: _served(cluster, reply.epoch_id), 60)
    assert status.estimated_memory_bytes > WORKER_MB * 1024 * 1024  # no single worker could hold it
    shard_ids = [f"{reply.epoch_id}.s{i}" for i in range(4)]
    def replicated():  # two READY replicas per shard (a balancing move may still be under way)
        listed = {e.epoch_id: e for e in cluster.client().status(TENANT, "orders").epochs}
        return all(listed[s].kind == "shard" and len([r for r in listed[s].replicas if r.state == "READY"]) == 2
                   for s in shard_ids) and listed
    listed = eventually(replicated, 30)
    assert sum(listed[s].total_rows for s in shard_ids) == ROWS
    for sql in EXACT:
        assert _query(gateway, sql) == _direct(table, 0, sql), sql
    # a point query on a partition value asks only the shard holding it
    before = _shard_calls(metrics_port)
    sql = "SELECT count(*) AS n, sum(amount) AS total FROM orders WHERE day = '2024-01-05'"
    assert _query(gateway, sql) == _direct(table, 0, sql)
    after = _shard_calls(metrics_port)
    assert (after["asked"] - before["asked"], after["pruned"] - before["pruned"]) == (1, 3)
    sql = "SELECT count(DISTINCT id) AS ids, median(amount) AS m FROM orders WHERE day = '2024-01-05'"
    assert _query(gateway, sql) == _direct(table, 0, sql)  # one shard holds all it reads: any shape
    assert {e["epoch"] for e in cluster.audit_events("admission.ASSIGNED")} >= {reply.epoch_id, *shard_ids}


# Heavy on every shard (a million products per row, in bounded memory) and merged as a plain sum.
SHARD_HEAVY = ("SELECT sum(list_sum(list_transform(range(1000), lambda x: list_sum(list_transform(range(1000), "
               "lambda y: (x * y + id) % 7))))) AS s FROM orders")


def test_a_sharded_query_whose_caller_gives_up_frees_every_shards_worker_within_a_second(shards):
    """Issue 41: a caller that gives up on a query of a sharded epoch (here its 2 s deadline passes,
    the query's own deadline being 60 s) has the query stopped on the worker of every shard asked:
    one query id for all, each worker told, each freed within 1 s of the caller's deadline, as
    each worker reports it (CLOCK_MONOTONIC, the clock the test takes the deadline on)."""
    import time

    import pyarrow.flight as flight

    from speedlayer.protocol.query import QueryRequest, call_options, location
    from tests.speedlayer.test_flight_sql import assert_freed_in_time

    cluster, gateway, _, _, reply = shards
    eventually(lambda: _served(cluster, reply.epoch_id), 60)
    logs = sorted(cluster.root.glob(f"worker-{TENANT}-w*.log"))
    seen = {log: len(log.read_text(errors="replace")) for log in logs}
    ticket = flight.Ticket(QueryRequest(dataset="orders", sql=SHARD_HEAVY, timeout_ms=60_000).to_ticket())
    with flight.connect(location(gateway)) as client:
        started = time.monotonic()
        with pytest.raises(flight.FlightTimedOutError):
            client.do_get(ticket, options=call_options(TENANT, timeout_s=2.0)).read_all()

    def freed() -> list[tuple[str, float]]:
        found = [(reason, float(at)) for log in logs
                 for reason, at in _FREED.findall(log.read_text(errors="replace")[seen[log]:])]
        return found if len(found) >= 4 else []

    assert_freed_in_time(eventually(freed, 30), started + 2.0, "a sharded query's caller gone (4 shards)")


_FREED = re.compile(r"query \w+ (cancelled|timeout): freed [\d.]+ ms after its interrupt was asked \(monotonic ([\d.]+)\)")


def _shard_calls(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    found = {"asked": 0.0, "pruned": 0.0}
    for line in text.splitlines():
        if line.startswith("gateway_shards_total{"):
            outcome = line.split('outcome="')[1].split('"')[0]
            found[outcome] += float(line.rsplit(" ", 1)[1])
    return found


@pytest.mark.parametrize("sql, construct", [
    ("SELECT count(DISTINCT day) FROM orders", "count(DISTINCT ...)"),
    ("SELECT median(amount) FROM orders", "aggregate median()"),
    ("SELECT id, sum(amount) OVER (ORDER BY id) FROM orders", "window function sum() OVER (...)"),
    ("SELECT a.id FROM orders a JOIN orders b ON a.id = b.id", "a join"),
])
def test_a_shape_that_cannot_be_merged_is_refused_naming_it_when_its_shards_exceed_the_gather_limit(
        shards, sql, construct):
    cluster, gateway, _, _, reply = shards
    eventually(lambda: _served(cluster, reply.epoch_id), 60)
    with pytest.raises(InvalidQueryError) as refused:
        _query(gateway, sql)
    message = str(refused.value)
    assert message.startswith(construct) and "split into 4 shards" in message
    needed = sum(s.estimated_memory_bytes for s in _shard_records(cluster, reply.epoch_id))
    assert f"needs {needed} bytes (4 shard(s)' estimated memory), the gather limit is {GATHER_MAX} bytes" in message


def _shard_records(cluster: SpeedLayerCluster, epoch: str) -> list[AssignmentRecord]:
    found = cluster.metadata.get_prefix(cluster.keys.dataset_assignments_prefix(TENANT, "orders"))
    return sorted((r for r in (AssignmentRecord.from_json(v, k) for k, v in found) if r.shard_of == epoch),
                  key=lambda r: r.epoch)


def test_a_shape_that_cannot_be_merged_is_gathered_when_the_shards_it_reads_fit_the_limit(shards):
    cluster, gateway, metrics_port, table, reply = shards
    eventually(lambda: _served(cluster, reply.epoch_id), 60)
    first, second = _shard_records(cluster, reply.epoch_id)[:2]
    assert first.estimated_memory_bytes + second.estimated_memory_bytes <= GATHER_MAX
    days = f"'{first.shard_values['day'][0]}', '{second.shard_values['day'][0]}'"  # two days, two shards
    before, gathers = _shard_calls(metrics_port), _gathers(metrics_port)
    for sql in (f"SELECT count(DISTINCT amount) AS amounts, median(amount) AS m, count(*) AS n FROM orders "
                f"WHERE day IN ({days})",
                f"SELECT id, day, sum(amount) OVER (PARTITION BY day ORDER BY id) AS running, "
                f"rank() OVER (ORDER BY amount DESC, id) AS r FROM orders WHERE day IN ({days}) ORDER BY id"):
        assert _query(gateway, sql) == _direct(table, 0, sql), sql
    after = _shard_calls(metrics_port)
    assert (after["asked"] - before["asked"], after["pruned"] - before["pruned"]) == (4, 4)
    assert _gathers(metrics_port) == {"gathered": gathers["gathered"] + 2, "refused": gathers["refused"]}
    with QueryClient(gateway, TENANT, token=None, client_id="shards-test") as client:
        answer = client.query("orders", f"SELECT median(id) AS m FROM orders WHERE day IN ({days}) AND amount > 90")
    note = answer.schema.metadata[b"speedlayer.note"].decode()
    assert note.startswith(f"gathered 2 of 4 shards of epoch {reply.epoch_id} (") and "columns id; WHERE pushed down)" in note
    assert note.endswith("aggregate median() does not combine from the shards' answers")


def _gathers(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    found = {"gathered": 0.0, "refused": 0.0}
    for line in text.splitlines():
        if line.startswith("gateway_shard_gathers_total{"):
            found[line.split('outcome="')[1].split('"')[0]] += float(line.rsplit(" ", 1)[1])
    return found


def _adbc(gateway: str, sql: str, parameters: tuple = ()) -> pa.Table:
    """`sql` through the ADBC Flight SQL driver (which prepares every statement: the gateway
    learns its result schema first), its `?`s bound to `parameters`."""
    adbc = pytest.importorskip("adbc_driver_flightsql.dbapi")
    with adbc.connect(f"grpc://{gateway}", db_kwargs={"username": TENANT, "password": "none"},
                      autocommit=True) as conn, conn.cursor() as cursor:
        cursor.execute(sql, parameters or None)
        return cursor.fetch_arrow_table()


def _native(gateway: str, sql: str) -> pa.Table:
    with QueryClient(gateway, TENANT, token=None, client_id="shards-test") as client:
        return client.query("orders", sql, timeout_ms=20_000)


def test_adbc_cannot_query_a_sharded_dataset_too_big_to_gather(shards):
    """Issue 41: ADBC prepares each statement and the gateway learned its result schema from the
    statement wrapped in a subquery, a shape the shards' merge refuses, so every ADBC statement on
    a dataset whose shards exceed the gather limit was refused ("reading subquery instead of the
    dataset"). The schema now comes from the shard plan run with no rows: nothing is gathered for
    it, and each answer equals the native client's and DuckDB's on the same Delta version."""
    cluster, gateway, metrics_port, table, reply = shards
    eventually(lambda: _served(cluster, reply.epoch_id), 60)
    gathers = _gathers(metrics_port)
    for sql in EXACT:
        answer, native = _adbc(gateway, sql), _native(gateway, sql)
        assert answer.to_pylist() == native.to_pylist() == _direct(table, 0, sql), sql
        assert answer.schema.types == native.schema.types, sql
    assert _gathers(metrics_port) == gathers  # merged shapes: no shard's rows were gathered
    # bound values: a partition value prunes to its shard, another column's is merged from all four
    for sql, value, literal in (("SELECT count(*) AS n, sum(amount) AS total FROM orders WHERE day = ?",
                                 "2024-01-05", "'2024-01-05'"),
                                ("SELECT day, max(amount) AS top FROM orders WHERE id < ? GROUP BY day ORDER BY day",
                                 1000, "1000")):
        expected = _direct(table, 0, sql.replace("?", literal))
        assert _adbc(gateway, sql, (value,)).to_pylist() == expected, sql
    # a shape that does not merge, on two shards (within the gather limit): gathered for the answer only
    first, second = _shard_records(cluster, reply.epoch_id)[:2]
    sql = (f"SELECT count(DISTINCT amount) AS amounts, median(amount) AS m FROM orders "
           f"WHERE day IN ('{first.shard_values['day'][0]}', '{second.shard_values['day'][0]}')")
    assert _adbc(gateway, sql).to_pylist() == _native(gateway, sql).to_pylist() == _direct(table, 0, sql)
    # on all four shards it is refused when it runs, as for the native client (not at prepare for its probe)
    sql = "SELECT median(amount) AS m FROM orders"
    with pytest.raises(InvalidQueryError) as native_refusal:
        _native(gateway, sql)
    with pytest.raises(Exception, match=re.escape(str(native_refusal.value))) as refused:
        _adbc(gateway, sql)
    assert "INVALID_ARGUMENT" in str(refused.value) and str(refused.value).count("aggregate median()") == 1


def _replicas_suspected(cluster: SpeedLayerCluster, offset: int) -> list[str]:
    """The gateway's log lines since `offset` saying a replica failed (and is tried last a while)."""
    text = (cluster.root / "gateway-g1.log").read_text(errors="replace")[offset:]
    return [line for line in text.splitlines() if "failed (" in line and "replica" in line]


# Fails on the shard's worker after its first rows (a cast of the 2,999th value of the first
# row's unnest, in DuckDB's second chunk): found while the worker reads its batches.
LATE_CAST = "SELECT CAST(CASE WHEN unnest(range(3000)) = 2999 THEN 'x' ELSE '1' END AS INTEGER) AS v FROM orders"


@pytest.mark.parametrize("sql, message", [
    ("SELECT nope FROM orders", 'Binder Error: Referenced column "nope" not found'),
    ("SELECT day, sum(nope) AS s FROM orders WHERE day = '2024-01-03' GROUP BY day",
     'Binder Error: Referenced column "nope" not found'),
    (LATE_CAST, "Conversion Error: Could not convert string 'x' to INT32"),
])
def test_a_shards_duckdb_error_is_invalid_argument_with_its_message_and_marks_no_replica_suspect(
        shards, sql, message):
    """Issue 41: a shard's DuckDB error reached a client as UNKNOWN. A failure DuckDB finds while
    the worker reads the answer's batches arrived as pyarrow's OSError and left the worker as an
    unclassified error: the gateway marked the shard's replica suspect, tried the next, and
    answered UNAVAILABLE (UNKNOWN once the answer streamed past the gateway's retry buffer); and
    through ADBC, the statement's schema probe was refused before the error could be seen."""
    cluster, gateway, _, _, reply = shards
    eventually(lambda: _served(cluster, reply.epoch_id), 60)
    offset = len((cluster.root / "gateway-g1.log").read_text(errors="replace"))
    with pytest.raises(InvalidQueryError, match=re.escape(message)):
        _native(gateway, sql)
    with pytest.raises(Exception, match=re.escape(message)) as refused:
        _adbc(gateway, sql)
    text = str(refused.value)
    assert "INVALID_ARGUMENT" in text and "Traceback" not in text and ".py" not in text, text
    assert _replicas_suspected(cluster, offset) == []


def test_more_shards_than_workers_is_refused_at_admission(shards):
    cluster, _, _, table, _ = shards
    with pytest.raises(grpc.RpcError) as refused:
        cluster.client().admit(delta_request("narrow", "orders", table, version=0))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    message = refused.value.details()
    assert "needs 8 shards but the tenant has 1 worker(s)" in message and f"({ESTIMATE // 10} bytes per shard)" in message
    assert not cluster.metadata.get_prefix(cluster.keys.tenant_assignments_prefix("narrow"))  # nothing persisted


def test_an_epoch_that_cannot_be_placed_says_what_it_needs_against_what_is_free(shards, tmp_path):
    cluster, _, _, _, _ = shards
    single = str(tmp_path / "single")
    from deltalake import write_deltalake

    # one file (it cannot be sharded) of hardly compressible numbers: ~10x the orders table in memory
    write_deltalake(single, pa.table({"x": pa.array([i * 2654435761 % 2**61 for i in range(10 * ROWS)], pa.int64())}))
    reply = cluster.client().admit(delta_request(TENANT, "single", single, version=0, replication=1))
    assert reply.status == "PLANNED" and "capacity: a replica needs" in reply.message, reply
    result = subprocess.run(
        [sys.executable, "-m", "speedlayer", "admin", "--masters", ",".join(cluster.master_addresses), "status",
         "--tenant", TENANT, "--dataset", "single"],
        capture_output=True, text=True, timeout=60, cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    epoch = json.loads(result.stdout)["epochs"][0]
    assert epoch["status"] == "PLANNED"
    assert "the most any worker has free is" in epoch["message"] and "free: w" in epoch["message"]


def test_a_shard_failing_on_every_worker_fails_the_epoch_and_the_previous_stays_served(shards):
    cluster, gateway, _, table, v0 = shards
    eventually(lambda: _served(cluster, v0.epoch_id), 60)
    # version 1 rewrites the table at half its size (fewer shards, one replica each: room for them
    # and for a retry next to version 0's replicas)
    _write(table, range(ROWS // 2), mode="overwrite")
    from deltalake import DeltaTable

    lost = sorted(DeltaTable(table, version=1).file_uris())[0]
    os.remove(lost)  # the version's log names a file that is gone: its shard cannot load anywhere
    reply = cluster.client().admit(delta_request(TENANT, "orders", table, version=1, replication=1))
    epoch = eventually(lambda: (e := cluster.client().status(TENANT, "orders", reply.epoch_id).epochs[0]).status
                       == "FAILED" and e, 60)
    assert re.search(r"^1 of [23] shards failed to load, so the epoch is not served", epoch.message)
    assert "max_load_failures=2 reached" in epoch.message and epoch.message.count(os.path.basename(lost)) >= 2
    failed_shard = [e for e in cluster.client().status(TENANT, "orders").epochs
                    if e.epoch_id.startswith(reply.epoch_id + ".") and e.status == "FAILED"
                    and "max_load_failures=2 reached" in e.message]
    assert len(failed_shard) == 1 and len([r for r in failed_shard[0].replicas if r.state == "FAILED"]) == 2
    sql = EXACT[0]
    assert _query(gateway, sql) == _direct(table, 0, sql)  # still version 0, whole


def test_no_query_fails_while_a_shard_replicas_worker_is_killed(shards):
    cluster, gateway, _, table, reply = shards
    eventually(lambda: _served(cluster, reply.epoch_id), 60)
    sql = "SELECT day, count(*) AS n, sum(amount) AS total FROM orders GROUP BY day ORDER BY day"
    expected = _direct(table, 0, sql)
    failures: list[str] = []
    answered = [0]
    stop = threading.Event()

    def ask() -> None:
        with QueryClient(gateway, TENANT, token=None, client_id="killer") as client:
            while not stop.is_set():
                try:
                    assert client.query("orders", sql, timeout_ms=20_000).to_pylist() == expected
                    answered[0] += 1
                except Exception as exc:  # every failure counts, whatever it is
                    failures.append(repr(exc))

    thread = threading.Thread(target=ask)
    thread.start()
    try:
        eventually(lambda: answered[0] >= 5, 30)
        cluster.kill_worker(f"{TENANT}/w1", signal.SIGKILL)
        done = answered[0]
        eventually(lambda: answered[0] >= done + 20, 60)
    finally:
        stop.set()
        thread.join(30)
    assert failures == []
