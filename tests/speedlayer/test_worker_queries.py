"""A worker's Flight query surface over a real DuckDB: epoch binding, swaps, limits, errors."""

from __future__ import annotations

import threading

import pyarrow.flight as flight
import re

import pytest

from speedlayer.clients.query_client import read_query
from speedlayer.errors import (
    InvalidQueryError, NotFoundError, QueryTimeoutError, ResultTooLargeError, TenantIsolationError,
    UnauthenticatedError,
)
from speedlayer.protocol.query import QueryLimits, QueryRequest, call_options, from_flight
from speedlayer.worker.flight_server import WorkerFlightServer
from speedlayer.worker.loader import EpochLoader
from speedlayer.worker.serving import ServedDatasets
from tests.rig import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
def worker():
    loader = EpochLoader(memory_limit_bytes=512 * 1024 * 1024, threads=1)
    dropped: list[str] = []

    def drop(table: str) -> None:
        dropped.append(table)
        loader.drop(table)

    served = ServedDatasets(drop_table=drop)
    server = WorkerFlightServer("grpc://127.0.0.1:0", tenant="acme", served=served, cursor=loader.cursor,
                                limits=QueryLimits(max_rows=100_000, max_bytes=64 * 1024 * 1024, timeout_ms=5_000))
    client = flight.connect(f"grpc://127.0.0.1:{server.port}")
    con = loader.cursor()
    con.execute("CREATE TABLE orders__v1 AS SELECT range AS id, range % 3 AS g FROM range(1000)")
    con.execute("CREATE TABLE orders__v2 AS SELECT range AS id, range % 3 AS g FROM range(300000)")
    served.publish("orders", "v1-a", "orders__v1", version=1)
    yield loader, served, client, dropped
    client.close()
    server.shutdown()


def run(client, sql, tenant="acme", dataset="orders", **kwargs):
    return read_query(client, QueryRequest(dataset=dataset, sql=sql, **kwargs), call_options(tenant))


def test_query_reads_the_newest_published_epoch_and_an_older_one_by_id(worker):
    _, served, client, _ = worker
    assert run(client, "SELECT count(*) AS n, sum(id) AS s FROM orders").to_pylist() == [{"n": 1000, "s": 499500}]
    served.publish("orders", "v2-b", "orders__v2", version=2)
    assert run(client, "SELECT count(*) AS n FROM orders").to_pylist() == [{"n": 300000}]
    assert run(client, "SELECT count(*) AS n FROM orders", epoch="v1-a").to_pylist() == [{"n": 1000}]
    # A lower version published later is not the newest.
    served.publish("orders", "v0-c", "orders__v1", version=0)
    assert served.resolve("orders").epoch == "v2-b"


def test_a_pinned_epoch_survives_a_swap_and_its_table_is_dropped_when_released(worker):
    loader, served, client, dropped = worker
    served.publish("orders", "v2-b", "orders__v2", version=2)
    pin = served.pin("orders")  # what a running query holds from bind to its last batch
    assert pin.served.epoch == "v2-b" and served.pins("orders", "v2-b") == 1
    loader.cursor().execute("CREATE TABLE orders__v3 AS SELECT range AS id, 0 AS g FROM range(5)")
    served.publish("orders", "v3-c", "orders__v3", version=3)
    assert served.retire("orders", "v2-b")
    assert "orders__v2" not in dropped
    assert loader.count("orders__v2") == 300000  # the pinned query can still read all of it
    assert run(client, "SELECT count(*) AS n FROM orders").to_pylist() == [{"n": 5}]
    with pytest.raises(NotFoundError, match="epoch 'v2-b'"):
        run(client, "SELECT 1 FROM orders", epoch="v2-b")
    pin.release()
    pin.release()  # idempotent
    assert dropped == ["orders__v2"]
    assert served.retire("orders", "v2-b") is False
    # A query's pin ends with its stream.
    assert run(client, "SELECT id FROM orders").num_rows == 5
    assert served.pins("orders", "v3-c") == 0


def test_bad_sql_names_the_dataset_and_only_select_runs(worker):
    loader, _, client, _ = worker
    with pytest.raises(InvalidQueryError, match="dataset 'orders'.*nope"):
        run(client, "SELECT nope FROM orders")
    with pytest.raises(InvalidQueryError, match="dataset 'orders'"):
        run(client, "SELEC 1")
    for sql in ("DROP TABLE orders__v1", "SELECT 1; SELECT 2", "COPY orders TO '/tmp/x.csv'"):
        with pytest.raises(InvalidQueryError, match="one SELECT"):
            run(client, sql)
    assert loader.cursor().execute("SELECT count(*) FROM orders__v1").fetchone() == (1000,)  # untouched


@pytest.mark.parametrize("sql, named", [
    ("SELECT * FROM read_parquet('/etc/passwd')", "read_parquet()"),
    ("SELECT * FROM '/etc/passwd'", "'/etc/passwd'"),
    ("SELECT * FROM orders__v2", "'orders__v2'"),
    ("SELECT * FROM main.orders", "'main.orders'"),
    ("SELECT * FROM orders WHERE id IN (SELECT id FROM orders__v1)", "'orders__v1'"),
    ("SELECT * FROM read_text('/etc/hostname')", "read_text()"),
    ("SELECT * FROM duckdb_settings()", "duckdb_settings()"),
])
def test_a_query_reads_nothing_but_its_dataset(worker, sql, named):
    """Regression: the worker's DuckDB reads any file the worker can, and holds every epoch table."""
    _, _, client, _ = worker
    with pytest.raises(InvalidQueryError, match=rf"dataset 'orders'.*{re.escape(named)}"):
        run(client, sql)


def test_ctes_and_subqueries_over_the_dataset_are_allowed(worker):
    _, _, client, _ = worker
    sql = ("WITH big AS (SELECT id, g FROM orders WHERE id >= 990) "
           "SELECT count(*) AS n FROM big JOIN (SELECT g FROM ORDERS GROUP BY g) USING (g)")
    assert run(client, sql).to_pylist() == [{"n": 10}]


@pytest.mark.parametrize("values", [3000, 100_000])  # failing in the first batch the worker reads, or a later one
def test_a_duckdb_error_found_while_the_batches_are_read_is_the_querys_fault(worker, values):
    """Issue 41: DuckDB's error for a row past its first chunk comes through Arrow's stream of
    batches as a plain OSError, which left the worker unclassified (UNKNOWN): the gateway took it
    for the replica's failure, marked the replica suspect and tried the next."""
    _, _, client, _ = worker
    sql = f"SELECT CAST(CASE WHEN unnest(range({values})) = {values - 1} THEN 'x' ELSE '1' END AS INTEGER) AS v FROM orders"
    with pytest.raises(InvalidQueryError, match="dataset 'orders' .*Conversion Error: Could not convert string 'x'"):
        run(client, sql)


def test_result_limits_and_deadline(worker):
    _, served, client, _ = worker
    served.publish("orders", "v2-b", "orders__v2", version=2)
    with pytest.raises(ResultTooLargeError, match=r"dataset 'orders'.*max_rows=10"):
        run(client, "SELECT * FROM orders", max_rows=10)
    with pytest.raises(ResultTooLargeError, match="max_bytes=1000"):
        run(client, "SELECT * FROM orders LIMIT 500", max_bytes=1000)
    assert run(client, "SELECT * FROM orders LIMIT 10", max_rows=10).num_rows == 10
    with pytest.raises(ResultTooLargeError, match="max_rows=100000"):  # the server's cap wins
        run(client, "SELECT * FROM orders", max_rows=10_000_000)
    with pytest.raises(QueryTimeoutError, match="deadline of 200 ms"):
        run(client, "SELECT count(*) FROM orders a, orders b WHERE (a.id * 7 + b.id) % 1000003 = 17", timeout_ms=200)


def test_tenant_and_dataset_errors(worker):
    _, _, client, _ = worker
    with pytest.raises(TenantIsolationError, match="tenant 'other'"):
        run(client, "SELECT 1 FROM orders", tenant="other")
    with pytest.raises(UnauthenticatedError):
        read_query(client, QueryRequest("orders", "SELECT 1"), flight.FlightCallOptions())
    with pytest.raises(NotFoundError, match="'missing'"):
        run(client, "SELECT 1", dataset="missing")
    with pytest.raises(NotFoundError, match="epoch 'v9'"):
        run(client, "SELECT 1", epoch="v9")


def test_cancelled_call_interrupts_the_query(worker):
    _, served, client, _ = worker
    served.publish("orders", "v2-b", "orders__v2", version=2)
    errors: list[Exception] = []

    def slow() -> None:
        try:
            run(client, "SELECT count(*) FROM orders a, orders b WHERE (a.id * 7 + b.id) % 1000003 = 17", timeout_ms=60_000)
        except Exception as exc:  # noqa: BLE001 - recorded for the assertion
            errors.append(exc)

    thread = threading.Thread(target=slow)
    thread.start()
    eventually(lambda: served.pins("orders", "v2-b") == 1, deadline_s=10)
    client.close()  # the caller goes away
    eventually(lambda: served.pins("orders", "v2-b") == 0, deadline_s=10)
    thread.join(10)
    assert errors


def test_a_cancel_from_the_gateway_stops_its_query_running_or_not_yet_begun(worker):
    """Issue 41: the gateway names a query by its id when its own caller has gone (CANCEL_ACTION);
    the cancel may overtake the query's DoGet, so an id cancelled first is refused when it comes."""
    from speedlayer.errors import QueryCancelledError
    from speedlayer.protocol.query import CANCEL_ACTION

    _, served, client, _ = worker
    served.publish("orders", "v2-b", "orders__v2", version=2)

    def cancel(query_id: str, tenant: str = "acme") -> None:
        list(client.do_action(flight.Action(CANCEL_ACTION, query_id.encode()), options=call_options(tenant)))

    cancel("early")
    with pytest.raises(QueryCancelledError, match="cancelled by its caller"):
        run(client, "SELECT count(*) FROM orders", query_id="early")
    assert run(client, "SELECT count(*) AS n FROM orders", query_id="other").to_pylist() == [{"n": 300000}]
    errors: list[Exception] = []

    def slow() -> None:
        try:
            run(client, "SELECT count(*) FROM orders a, orders b WHERE (a.id * 7 + b.id) % 1000003 = 17",
                timeout_ms=60_000, query_id="slow")
        except Exception as exc:  # noqa: BLE001 - recorded for the assertion
            errors.append(exc)

    thread = threading.Thread(target=slow)
    thread.start()
    eventually(lambda: served.pins("orders", "v2-b") == 1, deadline_s=10)
    with pytest.raises(flight.FlightError) as refused:
        cancel("slow", tenant="other")  # another tenant's cancel is refused
    assert isinstance(from_flight(refused.value), TenantIsolationError)
    cancel("slow")
    thread.join(10)
    assert served.pins("orders", "v2-b") == 0
    assert [type(e).__name__ for e in errors] == ["QueryCancelledError"], errors


def test_ticket_validation():
    from speedlayer.errors import InvalidRequestError

    for raw, match in ((b"nope", "not JSON"), (b"[]", "JSON object"), (b'{"sql": "SELECT 1"}', "'dataset'"),
                       (b'{"dataset": "d", "sql": "x", "max_rows": -1}', "max_rows=-1"),
                       (b'{"dataset": "d", "sql": "x", "timeout_ms": true}', "timeout_ms=True")):
        with pytest.raises(InvalidRequestError, match=match):
            QueryRequest.from_ticket(raw)
    request = QueryRequest("d", "SELECT 1", epoch="e", max_rows=5)
    assert QueryRequest.from_ticket(request.to_ticket()) == request
    assert QueryLimits(10, 100, 1000).effective(QueryRequest("d", "x", max_rows=20, timeout_ms=5)) == \
        QueryLimits(10, 100, 5)
    assert isinstance(from_flight(flight.FlightUnavailableError("down")), Exception)
