"""The gateway's Flight SQL pieces without servers: command decoding, statement analysis and
parameter binding, session tokens, metadata tables, and the errors a client gets for bad input
(malformed commands, unknown handles, wrong parameters, a dataset with no READY epoch)."""

from __future__ import annotations

import datetime
import decimal
import re
from typing import Iterator

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from google.protobuf import any_pb2

from speedlayer.api import flight_sql_pb2 as sql_pb2
from speedlayer.config import ConfigError, GatewayConfig, load_gateway_config
from speedlayer.errors import (
    InvalidQueryError, InvalidRequestError, NotFoundError, ReplicaUnavailableError, UnauthenticatedError,
)
from speedlayer.gateway.flight_sql import catalog
from speedlayer.gateway.flight_sql.auth import SessionTokens, call_tenant
from speedlayer.gateway.flight_sql.messages import ReadOnlyError, UnsupportedCommandError, pack, unpack
from speedlayer.gateway.flight_sql.held import AnswersAhead, PendingResults, PreparedStatements
from speedlayer.gateway.flight_sql.parameters import parameter_literals, parameter_schema
from speedlayer.gateway.flight_sql.parameters import same_kind as _same_kind
from speedlayer.gateway.flight_sql.service import FlightSqlService
from speedlayer.gateway.flight_sql.statements import LIMIT_HINT, analyse
from speedlayer.gateway.routing import ReplicaEndpoint, Route
from speedlayer.gateway.server import authenticate, colocated
from speedlayer.protocol.query import HEADERS_MIDDLEWARE

pytestmark = pytest.mark.unit


def _config(**kwargs) -> GatewayConfig:
    from danube_core.etcd_settings import EtcdSettings

    return GatewayConfig(host="127.0.0.1", port=0, etcd=EtcdSettings("127.0.0.1:2379"),
                         tokens={"acme": "s3cret"}, **kwargs)


# ---- commands --------------------------------------------------------------------------------


def test_malformed_and_refused_commands_get_clear_errors():
    with pytest.raises(InvalidRequestError, match="not a Flight SQL command"):
        unpack(b"\xff\xff\xff", "GetFlightInfo")
    with pytest.raises(InvalidRequestError, match="type URL 'type.googleapis.com/other.Message'"):
        unpack(any_pb2.Any(type_url="type.googleapis.com/other.Message").SerializeToString(), "GetFlightInfo")
    update = any_pb2.Any(type_url="type.googleapis.com/arrow.flight.protocol.sql.CommandStatementUpdate")
    with pytest.raises(ReadOnlyError, match="read-only") as refused:
        unpack(update.SerializeToString(), "GetFlightInfo")
    assert refused.value.status_name == "UNIMPLEMENTED"
    keys = any_pb2.Any(type_url="type.googleapis.com/arrow.flight.protocol.sql.CommandGetXdbcTypeInfo")
    with pytest.raises(UnsupportedCommandError, match="CommandGetXdbcTypeInfo is not supported"):
        unpack(keys.SerializeToString(), "GetFlightInfo")
    broken = any_pb2.Any(type_url="type.googleapis.com/arrow.flight.protocol.sql.CommandStatementQuery",
                         value=b"\x0a\x05ab")  # a string field cut short
    with pytest.raises(InvalidRequestError, match="malformed CommandStatementQuery"):
        unpack(broken.SerializeToString(), "GetFlightInfo")
    query = unpack(pack(sql_pb2.CommandStatementQuery(query="SELECT 1")), "GetFlightInfo")
    assert isinstance(query, sql_pb2.CommandStatementQuery) and query.query == "SELECT 1"


def test_type_urls_are_flight_sqls():
    packed = any_pb2.Any.FromString(pack(sql_pb2.TicketStatementQuery(statement_handle=b"h")))
    assert packed.type_url == "type.googleapis.com/arrow.flight.protocol.sql.TicketStatementQuery"


# ---- statements and parameters ---------------------------------------------------------------


def test_analyse_finds_datasets_parameters_and_cuts_the_tenants_qualifiers():
    statement = analyse('SELECT o.id FROM speedlayer.acme."orders" o WHERE day = ? AND amount < ? LIMIT ?', "acme")
    assert statement.datasets == ("orders",) and statement.parameter_count == 3
    assert statement.parameter_hints == ("day", "amount", LIMIT_HINT)
    assert statement.render(("'d'", "1.5", "3")) == \
        'SELECT o.id FROM "orders" AS "o" WHERE day = \'d\' AND amount < 1.5 LIMIT 3'
    with_cte = analyse("WITH recent AS (SELECT * FROM orders WHERE id > $1) SELECT count(*) FROM recent", "acme")
    assert with_cte.datasets == ("orders",) and with_cte.render(("7",)).endswith("id > 7) SELECT count(*) FROM recent")
    numbered = analyse("SELECT * FROM orders WHERE day = $2 AND id = $1", "acme")
    assert numbered.render(("7", "'d'")) == "SELECT * FROM orders WHERE day = 'd' AND id = 7"
    assert numbered.parameter_hints == ("id", "day")
    assert analyse("SELECT 'é', id FROM acme.orders WHERE id = ?", "acme").render(("1",)) == \
        "SELECT 'é', id FROM \"orders\" WHERE id = 1"  # byte offsets after a non-ASCII character


@pytest.mark.parametrize("sql, message", [
    ("INSERT INTO orders VALUES (1)", "SELECT"),
    ("SELECT 1; SELECT 2", "expected one SELECT statement"),
    ("SELECT * FROM other.orders", "'other.orders'"),
    ("SELECT * FROM read_parquet('/etc/x')", "table function read_parquet"),
    ("SELECT * FROM orders WHERE id = $2", "numbered from \\$1"),
    ("SELEC 1", "syntax error"),
])
def test_analyse_refuses(sql, message):
    with pytest.raises(InvalidQueryError, match=message):
        analyse(sql, "acme")


def test_a_statement_is_routed_by_its_first_dataset_and_joins_the_others():
    assert analyse("SELECT * FROM orders JOIN items USING (id)", "acme").targets() == ("items", ("orders",))
    with pytest.raises(InvalidQueryError, match="names no dataset"):
        analyse("SELECT 1", "acme").targets()


def test_a_join_runs_only_on_a_worker_holding_every_dataset():
    def route(dataset: str, *workers: str) -> Route:
        return Route("acme", dataset, f"{dataset}-e1", 1, tuple(ReplicaEndpoint(w, f"{w}:1") for w in workers))

    joint = colocated([route("items", "w2", "w1", "w3"), route("orders", "w1", "w2")])
    assert [r.worker for r in joint.replicas] == ["w2", "w1"] and joint.epoch == "items-e1"
    with pytest.raises(InvalidQueryError, match="datasets items, orders: no worker holds READY replicas of all of "
                                                "them \\(items \\(epoch items-e1\\) on w1; orders \\(epoch "
                                                "orders-e1\\) on w2, w3\\)"):
        colocated([route("items", "w1"), route("orders", "w2", "w3")])


def test_parameters_become_typed_literals_and_bad_ones_are_refused():
    batch = pa.record_batch({
        "i": [7], "s": ["it's"], "f": [0.25], "b": [True], "d": [datetime.date(2024, 1, 2)],
        "t": pa.array([datetime.datetime(2024, 1, 2, 3, 4, 5)], pa.timestamp("us")), "n": pa.array([None], pa.int64()),
        "x": [b"\x00\xff"], "m": pa.array([decimal.Decimal("1.50")], pa.decimal128(5, 2)),
    })
    assert parameter_literals(batch, 9) == (
        "CAST(7 AS BIGINT)", "CAST('it''s' AS VARCHAR)", "CAST(0.25 AS DOUBLE)", "CAST(TRUE AS BOOLEAN)",
        "CAST('2024-01-02' AS DATE)", "CAST('2024-01-02 03:04:05' AS TIMESTAMP)", "NULL",
        "CAST('\\x00\\xFF' AS BLOB)", "CAST('1.50' AS DECIMAL(5, 2))")
    with pytest.raises(InvalidRequestError, match="takes 2 parameter\\(s\\); 1 were bound"):
        parameter_literals(pa.record_batch({"a": [1]}), 2)
    with pytest.raises(InvalidRequestError, match="one row of parameters"):
        parameter_literals(pa.record_batch({"a": [1, 2]}), 1)
    with pytest.raises(InvalidRequestError, match="parameter 1 \\('a'\\): type list<item: int64> is not supported"):
        parameter_literals(pa.record_batch({"a": [[1]]}), 1)


def test_parameter_schema_types_parameters_by_the_columns_they_meet():
    columns = pa.schema([("id", pa.int64()), ("day", pa.string())])
    statement = analyse("SELECT * FROM orders WHERE id = ? AND day IN (?, ?) AND ? + 1 > 2 LIMIT ?", "acme")
    assert parameter_schema(statement, columns).types == [pa.int64(), pa.string(), pa.string(), pa.string(), pa.int64()]


def test_prepared_statements_and_pending_results_are_per_tenant_and_expire():
    prepared = PreparedStatements(idle_s=60)
    handle = prepared.create("acme", analyse("SELECT * FROM orders", "acme"))
    assert prepared.get("acme", handle).tenant == "acme"
    with pytest.raises(NotFoundError, match="unknown prepared statement handle"):
        prepared.get("other", handle)
    prepared.close("other", handle)  # another tenant's close leaves it open
    prepared.close("acme", handle)
    prepared.close("acme", handle)  # idempotent
    with pytest.raises(NotFoundError, match="unknown prepared statement handle"):
        prepared.get("acme", handle)
    pending = PendingResults(ttl_s=60, capacity=1)
    key = pending.put("acme", pa.schema([]), iter([]))
    with pytest.raises(Exception, match="waiting to be read"):
        pending.put("acme", pa.schema([]), iter([]))
    with pytest.raises(NotFoundError, match="unknown statement handle"):
        pending.take("other", key)
    pending.take("acme", key)
    with pytest.raises(NotFoundError, match="read once"):
        pending.take("acme", key)


# ---- sessions --------------------------------------------------------------------------------


def test_session_tokens_name_their_tenant_expire_and_die_with_the_tenants_token():
    now = [1000.0]
    sessions = SessionTokens(_config(flight_sql_session_ttl_s=60), clock=lambda: now[0])
    sessions.check_password("acme", "s3cret")
    for tenant, password, message in (("acme", "nope", "wrong password"), ("a b", "x", "not a tenant id")):
        with pytest.raises(UnauthenticatedError, match=message):
            sessions.check_password(tenant, password)
    token = sessions.issue("acme")
    assert sessions.verify(token) == "acme"
    assert call_tenant({"authorization": f"Bearer {token}"}, sessions, authenticate) == "acme"
    with pytest.raises(UnauthenticatedError, match="not valid"):
        sessions.verify(token[:-2] + ("AA" if not token.endswith("AA") else "BB"))
    rotated = SessionTokens(_config(flight_sql_session_ttl_s=60), clock=lambda: now[0])
    rotated.config.tokens["acme"] = "new-token"
    with pytest.raises(UnauthenticatedError, match="not valid"):
        rotated.verify(token)
    now[0] += 61
    with pytest.raises(UnauthenticatedError, match="session of tenant 'acme' expired"):
        sessions.verify(token)
    assert sessions.verify(token, allow_expired=True) == "acme"
    with pytest.raises(UnauthenticatedError, match="no credentials"):
        call_tenant({}, sessions, authenticate)
    with pytest.raises(UnauthenticatedError, match="not a session token"):
        call_tenant({"authorization": "Bearer s3cret"}, sessions, authenticate)


def test_a_verified_session_is_remembered_until_it_expires_or_the_tenants_token_changes():
    now = [1000.0]
    sessions = SessionTokens(_config(flight_sql_session_ttl_s=60), clock=lambda: now[0])
    token = sessions.issue("acme")
    assert sessions.verify(token) == sessions.verify(token) == "acme"
    sessions.config.tokens["acme"] = "rotated"
    with pytest.raises(UnauthenticatedError, match="not valid"):
        sessions.verify(token)
    sessions.config.tokens["acme"] = "s3cret"
    assert sessions.verify(token) == "acme"
    now[0] += 61
    with pytest.raises(UnauthenticatedError, match="expired"):
        sessions.verify(token)


# ---- statements started ahead ----------------------------------------------------------------


def test_answers_started_ahead_go_to_the_same_handle_tenant_and_values_only_and_are_bounded():
    import threading
    import time

    schema = pa.schema([("n", pa.int64())])
    answer = (schema, [pa.record_batch([pa.array([1])], schema=schema)])
    ahead = AnswersAhead(capacity=2, ttl_s=60, threads=1)
    try:
        assert ahead.start(b"h1", "acme", ("1",), ("e1",), lambda: answer)
        for tenant, values in (("other", ("1",)), ("acme", ("2",))):
            assert ahead.start(b"h1", "acme", ("1",), ("e1",), lambda: answer)
            assert ahead.take(b"h1", tenant, values) is None  # and dropped
            assert ahead.take(b"h1", "acme", ("1",)) is None
        assert ahead.start(b"h1", "acme", ("1",), ("e1",), lambda: answer)
        started = ahead.take(b"h1", "acme", ("1",))
        assert started.epochs == ("e1",) and started.future.result() == answer
        assert ahead.take(b"h1", "acme", ("1",)) is None  # taken once

        began, release, closed = threading.Event(), threading.Event(), []

        def stream():
            try:
                yield from answer[1]
            finally:
                closed.append(True)

        def slow():
            began.set()
            release.wait(10)
            batches = stream()
            next(batches)  # the stream is open
            return schema, batches

        assert ahead.start(b"h2", "acme", (), ("e1",), slow) and began.wait(10)
        assert ahead.start(b"h3", "acme", (), ("e1",), lambda: answer)  # queued behind h2 (one thread)
        assert not ahead.start(b"h4", "acme", (), ("e1",), lambda: answer)  # capacity 2
        ahead.discard(b"h3")  # not begun: cancelled
        ahead.discard(b"h2")  # begun: its stream is closed once it is there
        release.set()
        deadline = time.monotonic() + 10
        while not closed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert closed and len(ahead) == 0
        expiring = AnswersAhead(ttl_s=0.0, threads=1)
        expiring.start(b"h", "acme", (), ("e1",), lambda: answer)
        assert expiring.take(b"h", "acme", ()) is None
        expiring.close()
    finally:
        ahead.close()


def test_a_statements_schema_is_known_ahead_only_when_its_parameters_filter():
    assert analyse("SELECT * FROM orders WHERE id = ? LIMIT ?", "acme").fixed_schema
    assert analyse("SELECT day FROM orders GROUP BY day HAVING count(*) > ?", "acme").fixed_schema
    assert not analyse("SELECT ? AS x FROM orders", "acme").fixed_schema
    assert not analyse("SELECT coalesce(day, ?) FROM orders WHERE id = ?", "acme").fixed_schema
    assert _same_kind(pa.utf8(), pa.large_string()) and _same_kind(pa.int64(), pa.float64())
    assert _same_kind(pa.null(), pa.int32()) and _same_kind(pa.date32(), pa.timestamp("us"))
    assert not _same_kind(pa.utf8(), pa.int64()) and not _same_kind(pa.int64(), pa.utf8())


def test_gateway_tls_settings_are_checked_up_front(tmp_path):
    config = tmp_path / "gateway.yaml"
    config.write_text("gateway: {tls_cert_file: /c.pem}\n")
    with pytest.raises(ConfigError, match="tls_cert_file and gateway.tls_key_file go together"):
        load_gateway_config(str(config), environ={})
    config.write_text("gateway: {tls_client_ca_file: /ca.pem}\n")
    with pytest.raises(ConfigError, match="tls_client_ca_file needs"):
        load_gateway_config(str(config), environ={})
    config.write_text("gateway: {tls_cert_file: /c.pem, tls_key_file: /k.pem, flight_sql_session_ttl_seconds: 60}\n")
    loaded = load_gateway_config(str(config), environ={})
    assert loaded.tls and loaded.flight_sql_session_ttl_s == 60


# ---- metadata --------------------------------------------------------------------------------


def test_metadata_tables_have_flight_sqls_schemas_and_filters():
    info = catalog.sql_info([0, 3, 8, 99999], "1.2.3", 30_000)
    assert info.schema == catalog.SQL_INFO_SCHEMA
    assert info.to_pylist() == [{"info_name": 0, "value": catalog.SERVER_NAME}, {"info_name": 3, "value": True},
                                {"info_name": 8, "value": 0}]
    datasets = [catalog.DatasetTable("orders", pa.schema([("id", pa.int64())])), catalog.DatasetTable("items", None)]
    tables = catalog.tables("acme", datasets, catalog=None, schema_pattern="ac%", table_pattern="or_ers",
                            table_types=[], include_schema=True)
    assert tables.column("table_name").to_pylist() == ["orders"]
    assert pa.ipc.read_schema(pa.py_buffer(tables.column("table_schema")[0].as_py())).names == ["id"]
    assert catalog.tables("acme", datasets, catalog="elsewhere", schema_pattern=None, table_pattern=None,
                          table_types=[], include_schema=False).num_rows == 0
    assert catalog.tables("acme", datasets, catalog=None, schema_pattern=None, table_pattern=None,
                          table_types=["VIEW"], include_schema=False).num_rows == 0
    assert catalog.db_schemas("acme", None, "other").num_rows == 0
    assert catalog.like("a\\_b", "a_b") and not catalog.like("a\\_b", "axb")


# ---- the service's errors, with a fake gateway -----------------------------------------------


class _Middleware:
    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers


class _Context:
    def __init__(self, headers: dict[str, str]) -> None:
        self._headers = _Middleware(headers)

    def get_middleware(self, name: str) -> _Middleware | None:
        return self._headers if name == HEADERS_MIDDLEWARE else None

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5000"


class _NoReadyRouting:
    def route(self, tenant: str, dataset: str, client_id: str, epoch: str | None = None):
        raise ReplicaUnavailableError(f"dataset {dataset!r} of tenant {tenant!r} has no READY replica yet")

    def datasets(self, tenant: str) -> list[str]:
        return ["orders"]


class _FakeGateway:
    def __init__(self) -> None:
        self.config = _config()
        self.routing = _NoReadyRouting()

    def run_sql(self, tenant, dataset, sql, client_id, epoch=None, joined=()) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
        return self.routing.route(tenant, dataset, client_id, epoch)

    def relay(self, batches, tenant, started, context):
        return batches


def _service_and_context() -> tuple[FlightSqlService, _Context]:
    service = FlightSqlService(_FakeGateway(), authenticate)
    token = service.sessions.issue("acme")
    return service, _Context({"authorization": f"Bearer {token}"})


def _descriptor(message) -> flight.FlightDescriptor:
    return flight.FlightDescriptor.for_command(pack(message))


def test_service_errors_carry_flight_sqls_status_codes():
    service, context = _service_and_context()
    with pytest.raises(flight.FlightUnavailableError, match="no READY replica yet"):  # retryable
        service.get_flight_info(context, _descriptor(sql_pb2.CommandStatementQuery(query="SELECT * FROM orders")))
    with pytest.raises(pa.ArrowInvalid, match="not a Flight SQL command"):
        service.get_flight_info(context, flight.FlightDescriptor.for_command(b"\x01garbage"))
    with pytest.raises(pa.ArrowInvalid, match="prepare it"):
        service.get_flight_info(context, _descriptor(sql_pb2.CommandStatementQuery(query="SELECT * FROM orders WHERE id = ?")))
    with pytest.raises(pa.ArrowKeyError, match="unknown prepared statement handle"):
        service.get_flight_info(context, _descriptor(sql_pb2.CommandPreparedStatementQuery(
            prepared_statement_handle=b"nope")))
    with pytest.raises(pa.ArrowKeyError, match="unknown statement handle"):
        service.do_get(context, pack(sql_pb2.TicketStatementQuery(statement_handle=b"nope")))
    with pytest.raises(pa.ArrowNotImplementedError, match="read-only"):
        service.do_action(context, flight.Action("BeginTransaction", b""))
    with pytest.raises(pa.ArrowNotImplementedError, match="read-only"):
        service.get_flight_info(context, _descriptor(sql_pb2.CommandStatementQuery(query="SELECT 1",
                                                                                   transaction_id=b"t")))
    with pytest.raises(flight.FlightUnauthenticatedError, match="no credentials"):
        service.get_flight_info(_Context({}), _descriptor(sql_pb2.CommandGetCatalogs()))
    # GetTables lists a dataset with no READY epoch, with an empty schema.
    info = service.get_flight_info(context, _descriptor(sql_pb2.CommandGetTables(include_schema=True)))
    ticket = info.endpoints[0].ticket.ticket
    assert service.pending.take("acme", unpack(ticket, "t").statement_handle)[0] == catalog.TABLES_WITH_SCHEMA_SCHEMA


def test_query_tickets_carry_joined_datasets_and_the_guard_admits_only_those():
    from speedlayer.protocol.query import QueryRequest
    from speedlayer.worker.sql_guard import check_query

    request = QueryRequest("items", "SELECT 1", epoch="e1", joined=(("orders", "e2"),))
    assert QueryRequest.from_ticket(request.to_ticket()) == request
    assert b"joined" not in QueryRequest("items", "SELECT 1").to_ticket()  # the native ticket, unchanged
    with pytest.raises(InvalidRequestError, match="'joined' must map dataset -> epoch"):
        QueryRequest.from_ticket(b'{"dataset": "items", "sql": "SELECT 1", "joined": ["orders"]}')
    check_query("SELECT * FROM items JOIN orders USING (id)", "items", ("orders",))
    with pytest.raises(InvalidQueryError, match="it reads 'orders'"):
        check_query("SELECT * FROM items JOIN orders USING (id)", "items")


def test_statements_differing_only_in_filter_literals_share_a_shape():
    def shape(sql: str) -> str:
        return analyse(sql, "acme").shape

    assert shape("SELECT * FROM orders WHERE id = 5 AND day = 'a' LIMIT 10") == \
        shape("SELECT *  FROM orders WHERE id = 61234 AND day = 'bbb' LIMIT 3")
    assert shape("SELECT day, count(*) FROM orders GROUP BY day HAVING count(*) > 1") == \
        shape("SELECT day, count(*) FROM orders GROUP BY day HAVING count(*) > 100")
    assert shape("SELECT 5 AS x FROM orders") != shape("SELECT 5000000000 AS x FROM orders")  # INTEGER vs BIGINT
    assert shape("SELECT id FROM orders WHERE id = 5") != shape("SELECT day FROM orders WHERE id = 5")


# ---- review fixes: pinned joins, probes, releases, per-tenant caps, errors -------------------


class _Routing:
    """Routes each dataset to `epochs[dataset]` (changed by a test to make a newer epoch READY)."""

    def __init__(self, epochs: dict[str, str]) -> None:
        self.epochs = epochs

    def route(self, tenant: str, dataset: str, client_id: str, epoch: str | None = None) -> Route:
        return Route(tenant, dataset, epoch or self.epochs[dataset], 1, (ReplicaEndpoint("w1", "127.0.0.1:1"),))

    def datasets(self, tenant: str) -> list[str]:
        return sorted(self.epochs)


class _RecordingGateway:
    """Answers every statement with one int64 column `n` and records each run's pinned epochs."""

    schema = pa.schema([("n", pa.int64())])

    def __init__(self, epochs: dict[str, str]) -> None:
        self.config = _config()
        self.routing = _Routing(epochs)
        self.runs: list[tuple[str, str | None, tuple[str, ...], tuple[str | None, ...]]] = []

    def run_sql(self, tenant, dataset, sql, client_id, epoch=None, joined=(), joined_epochs=()):
        self.runs.append((sql, epoch, tuple(joined), tuple(joined_epochs)))
        if "syntax" in sql.split("LIMIT 0")[-1]:  # nothing follows the probe's LIMIT 0
            raise InvalidQueryError("Parser Error: syntax error")
        return self.schema, [pa.record_batch([pa.array([len(self.runs)])], schema=self.schema)]

    def relay(self, batches, tenant, started, context):
        return batches


def _prepare(service, context, sql: str) -> bytes:
    body = pack(sql_pb2.ActionCreatePreparedStatementRequest(query=sql))
    [result] = service.do_action(context, flight.Action("CreatePreparedStatement", body))
    packed, created = any_pb2.Any(), sql_pb2.ActionCreatePreparedStatementResult()
    packed.ParseFromString(result.body.to_pybytes())
    packed.Unpack(created)
    return created.prepared_statement_handle


def test_a_join_started_early_is_pinned_to_every_epoch_and_not_served_after_a_newer_one():
    import time

    gateway = _RecordingGateway({"orders": "o1", "items": "i1"})
    service = FlightSqlService(gateway, authenticate)
    context = _Context({"authorization": f"Bearer {service.sessions.issue('acme')}"})
    try:
        handle = _prepare(service, context, "SELECT count(*) AS n FROM orders JOIN items USING (id)")
        deadline = time.monotonic() + 10
        while not any(run[0].startswith("SELECT count") for run in gateway.runs) and time.monotonic() < deadline:
            time.sleep(0.01)
        early = [run for run in gateway.runs if run[0].startswith("SELECT count")]
        assert early == [(early[0][0], "i1", ("orders",), ("o1",))]  # every dataset pinned (items routes)
        probes = [run for run in gateway.runs if "speedlayer_probe" in run[0]]
        assert probes and all(run[1:] == ("i1", ("orders",), ("o1",)) for run in probes)
        gateway.routing.epochs["orders"] = "o2"  # a newer READY epoch of the joined dataset
        before = len(gateway.runs)
        service.get_flight_info(context, _descriptor(sql_pb2.CommandPreparedStatementQuery(
            prepared_statement_handle=handle)))
        # The early answer (orders o1) is dropped: the statement runs again, on the newest epochs.
        assert [run[1:] for run in gateway.runs[before:]] == [(None, ("orders",), ())]
    finally:
        service.close()


def test_the_schema_probe_survives_a_statement_ending_with_a_comment():
    from speedlayer.gateway.flight_sql.service import probe_sql

    duckdb = pytest.importorskip("duckdb")
    for sql in ("SELECT 1 AS n -- the end", "SELECT 1 AS n -- the end;", "SELECT 1 AS n;", "SELECT 1 AS n; -- the end",
                "SELECT 1 AS n /* a; b */ ;;\n-- c\n;", "SELECT 1 AS n;;;"):
        probe = probe_sql(analyse(sql.replace("SELECT 1 AS n", "SELECT 1 AS n FROM orders"), "acme"))
        with duckdb.connect() as conn:
            conn.execute("CREATE TABLE orders AS SELECT 1 AS id")
            assert [d[0] for d in conn.execute(probe).description] == ["n"], probe


def test_semicolons_and_comments_after_a_statement_are_cut_and_a_second_statement_is_named():
    for sql in ("SELECT 'é;--' AS x FROM orders WHERE id = ?; -- lookup", "SELECT 'é;--' AS x FROM orders WHERE id = ?",
                "SELECT 'é;--' AS x FROM orders WHERE id = ? /* c; */ ;;\n", "SELECT 'é;--' AS x FROM orders WHERE id = ?;--"):
        assert analyse(sql, "acme").render(("1",)) == "SELECT 'é;--' AS x FROM orders WHERE id = 1", sql
    for sql, second in (("SELECT * FROM orders; SELECT * FROM items", "SELECT * FROM items"),
                        ("SELECT * FROM orders; -- c\nDELETE FROM orders", "DELETE FROM orders")):
        with pytest.raises(InvalidQueryError, match=re.escape(f"another statement, {second!r}")) as refused:
            analyse(sql, "acme")
        assert refused.value.status_name == "INVALID_ARGUMENT"


def test_a_session_token_with_a_non_ascii_signature_is_unauthenticated():
    sessions = SessionTokens(_config(flight_sql_session_ttl_s=60))
    token = sessions.issue("acme")
    for forged in (token[:-1] + "é", token.replace(".", ".é", 2), "sls1.é.x"):
        with pytest.raises(UnauthenticatedError):
            sessions.verify(forged)


def _stream(closed: list[str], name: str):
    schema = pa.schema([("n", pa.int64())])

    def batches():
        try:
            yield pa.record_batch([pa.array([1])], schema=schema)
        finally:
            closed.append(name)

    started = batches()
    next(started)  # open, as a worker's stream is
    return started


def test_pending_results_release_what_they_refuse_or_expire_and_are_capped_per_tenant():
    import time

    from speedlayer.errors import GatewayStateExhaustedError

    closed: list[str] = []
    pending = PendingResults(ttl_s=60, capacity=3, per_tenant=2)
    kept = [pending.put("acme", pa.schema([]), _stream(closed, f"a{i}")) for i in range(2)]
    with pytest.raises(GatewayStateExhaustedError, match="for tenant 'acme'") as refused:
        pending.put("acme", pa.schema([]), _stream(closed, "refused"))
    assert refused.value.status_name == "RESOURCE_EXHAUSTED" and closed == ["refused"]
    pending.put("other", pa.schema([]), iter([]))  # another tenant still has room
    with pytest.raises(GatewayStateExhaustedError, match="at this gateway"):
        pending.put("third", pa.schema([]), iter([]))
    pending.take("acme", kept[0])
    short = PendingResults(ttl_s=0.01)
    short.put("acme", pa.schema([]), _stream(closed, "expired"))
    time.sleep(0.02)
    assert len(short) == 0 and closed[-1] == "expired"


def test_prepared_statements_are_capped_per_tenant_without_evicting_another_tenants():
    from speedlayer.errors import GatewayStateExhaustedError

    prepared = PreparedStatements(capacity=3, per_tenant=2)
    statement = analyse("SELECT * FROM orders", "acme")
    other = prepared.create("other", statement)
    first, second, third = (prepared.create("acme", statement) for _ in range(3))
    with pytest.raises(NotFoundError):
        prepared.get("acme", first)  # the tenant's own oldest went
    assert prepared.get("other", other) and prepared.get("acme", second) and prepared.get("acme", third)
    with pytest.raises(GatewayStateExhaustedError, match="prepared statements are open"):
        prepared.create("third", statement)
    assert prepared.get("other", other)


def test_answers_ahead_are_capped_per_tenant_and_expired_ones_are_dropped_on_len_and_take():
    import time

    schema = pa.schema([("n", pa.int64())])
    closed: list[str] = []
    ahead = AnswersAhead(capacity=4, ttl_s=60, threads=1, per_tenant=1)
    try:
        assert ahead.start(b"a", "acme", (), ("e1",), lambda: (schema, []))
        assert not ahead.start(b"b", "acme", (), ("e1",), lambda: (schema, []))
        assert ahead.start(b"c", "other", (), ("e1",), lambda: (schema, []))
    finally:
        ahead.close()
    short = AnswersAhead(ttl_s=0.05, threads=1)
    try:
        short.start(b"a", "acme", (), ("e1",), lambda: (schema, _stream(closed, "a")))
        short.start(b"b", "acme", (), ("e1",), lambda: (schema, _stream(closed, "b")))
        time.sleep(0.1)
        assert short.take(b"a", "acme", ()) is None and len(short) == 0
        deadline = time.monotonic() + 10
        while len(closed) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(closed) == ["a", "b"]
    finally:
        short.close()


def test_read_only_and_unsupported_commands_are_unimplemented_not_invalid_and_survive_flight():
    from danube_core.errors import UnimplementedError
    from speedlayer.protocol.query import from_flight, to_flight

    for cls in (ReadOnlyError, UnsupportedCommandError):
        error = cls("no writes")
        assert isinstance(error, UnimplementedError) and error.status_name == "UNIMPLEMENTED"
        assert not isinstance(error, (ValueError, InvalidRequestError))
        rebuilt = from_flight(to_flight(error))
        assert type(rebuilt) is cls and str(rebuilt) == "no writes"
