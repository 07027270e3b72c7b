"""The gateway's Flight SQL state without servers: session tokens and the TLS settings, the
statements it holds for a client (prepared statements, pending results, answers started ahead) and
their per-tenant caps, the metadata tables, and the status codes a client gets for bad input
(unknown handles, read-only or unsupported commands, a dataset with no READY epoch). Commands,
statement analysis, parameters and routing are in `test_flight_sql_statement_units`."""

from __future__ import annotations

import contextlib
from typing import Iterator

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from speedlayer.api import flight_sql_pb2 as sql_pb2
from speedlayer.config import ConfigError, load_gateway_config
from speedlayer.errors import InvalidRequestError, NotFoundError, ReplicaUnavailableError, UnauthenticatedError
from speedlayer.gateway.flight_sql import catalog
from speedlayer.gateway.flight_sql.auth import SessionTokens, call_tenant
from speedlayer.gateway.flight_sql.held import AnswersAhead, PendingResults, PreparedStatements
from speedlayer.gateway.flight_sql.messages import ReadOnlyError, UnsupportedCommandError, pack, unpack
from speedlayer.gateway.flight_sql.service import FlightSqlService
from speedlayer.gateway.flight_sql.statements import analyse
from speedlayer.gateway.server import authenticate
from tests.speedlayer.flight_sql_fakes import CallContext as _Context
from tests.speedlayer.flight_sql_fakes import command_descriptor as _descriptor
from tests.speedlayer.flight_sql_fakes import gateway_config as _config

pytestmark = pytest.mark.unit


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


def test_a_session_token_with_a_non_ascii_signature_is_unauthenticated():
    sessions = SessionTokens(_config(flight_sql_session_ttl_s=60))
    token = sessions.issue("acme")
    for forged in (token[:-1] + "é", token.replace(".", ".é", 2), "sls1.é.x"):
        with pytest.raises(UnauthenticatedError):
            sessions.verify(forged)


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


# ---- held statements: prepared, pending, started ahead; per-tenant caps ----------------------


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


def test_answers_started_ahead_go_to_the_same_handle_tenant_and_values_only_and_are_bounded():
    import threading
    import time

    schema = pa.schema([("n", pa.int64())])
    answer = (schema, [pa.record_batch([pa.array([1])], schema=schema)])
    ahead = AnswersAhead(capacity=2, ttl_s=60, threads=1)
    try:
        assert ahead.start(b"h1", "acme", ("1",), ("e1",), "q", lambda: answer)
        for tenant, values in (("other", ("1",)), ("acme", ("2",))):
            assert ahead.start(b"h1", "acme", ("1",), ("e1",), "q", lambda: answer)
            assert ahead.take(b"h1", tenant, values) is None  # and dropped
            assert ahead.take(b"h1", "acme", ("1",)) is None
        assert ahead.start(b"h1", "acme", ("1",), ("e1",), "q", lambda: answer)
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

        assert ahead.start(b"h2", "acme", (), ("e1",), "q", slow) and began.wait(10)
        assert ahead.start(b"h3", "acme", (), ("e1",), "q", lambda: answer)  # queued behind h2 (one thread)
        assert not ahead.start(b"h4", "acme", (), ("e1",), "q", lambda: answer)  # capacity 2
        ahead.discard(b"h3")  # not begun: cancelled
        ahead.discard(b"h2")  # begun: its stream is closed once it is there
        release.set()
        deadline = time.monotonic() + 10
        while not closed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert closed and len(ahead) == 0
        expiring = AnswersAhead(ttl_s=0.0, threads=1)
        expiring.start(b"h", "acme", (), ("e1",), "q", lambda: answer)
        assert expiring.take(b"h", "acme", ()) is None
        expiring.close()
    finally:
        ahead.close()


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
        assert ahead.start(b"a", "acme", (), ("e1",), "q", lambda: (schema, []))
        assert not ahead.start(b"b", "acme", (), ("e1",), "q", lambda: (schema, []))
        assert ahead.start(b"c", "other", (), ("e1",), "q", lambda: (schema, []))
    finally:
        ahead.close()
    short = AnswersAhead(ttl_s=0.05, threads=1)
    try:
        short.start(b"a", "acme", (), ("e1",), "q", lambda: (schema, _stream(closed, "a")))
        short.start(b"b", "acme", (), ("e1",), "q", lambda: (schema, _stream(closed, "b")))
        time.sleep(0.1)
        assert short.take(b"a", "acme", ()) is None and len(short) == 0
        deadline = time.monotonic() + 10
        while len(closed) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(closed) == ["a", "b"]
    finally:
        short.close()


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


class _NoReadyRouting:
    def route(self, tenant: str, dataset: str, client_id: str, epoch: str | None = None):
        raise ReplicaUnavailableError(f"dataset {dataset!r} of tenant {tenant!r} has no READY replica yet")

    def datasets(self, tenant: str) -> list[str]:
        return ["orders"]


class _FakeGateway:
    def __init__(self) -> None:
        self.config = _config()
        self.routing = _NoReadyRouting()

    def run_sql(self, tenant, dataset, sql, client_id, epoch=None, joined=(), parameters="", query_id="") -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
        return self.routing.route(tenant, dataset, client_id, epoch)

    def relay(self, batches, tenant, started, context):
        return batches

    def watching_caller(self, context, query_id):
        return contextlib.nullcontext()


def _service_and_context() -> tuple[FlightSqlService, _Context]:
    service = FlightSqlService(_FakeGateway(), authenticate)
    token = service.sessions.issue("acme")
    return service, _Context({"authorization": f"Bearer {token}"})


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


def test_read_only_and_unsupported_commands_are_unimplemented_not_invalid_and_survive_flight():
    from danube_core.errors import UnimplementedError
    from speedlayer.protocol.query import from_flight, to_flight

    for cls in (ReadOnlyError, UnsupportedCommandError):
        error = cls("no writes")
        assert isinstance(error, UnimplementedError) and error.status_name == "UNIMPLEMENTED"
        assert not isinstance(error, (ValueError, InvalidRequestError))
        rebuilt = from_flight(to_flight(error))
        assert type(rebuilt) is cls and str(rebuilt) == "no writes"
