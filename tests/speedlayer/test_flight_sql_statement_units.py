"""The gateway's Flight SQL statements without servers: command decoding, statement analysis
(datasets, qualifiers, shapes, trailing semicolons and comments, refusals), parameter binding and
typing, and routing a statement, a join included, to the workers and epochs holding its datasets.
Sessions, held statements, metadata tables and status codes are in `test_flight_sql_session_units`."""

from __future__ import annotations

import contextlib
import datetime
import decimal
import re

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from google.protobuf import any_pb2

from speedlayer.api import flight_sql_pb2 as sql_pb2
from speedlayer.errors import InvalidQueryError, InvalidRequestError, ReplicaUnavailableError
from speedlayer.gateway.flight_sql.messages import ReadOnlyError, UnsupportedCommandError, pack, unpack
from speedlayer.gateway.flight_sql.parameters import in_zone, parameter_schema, parameter_values
from speedlayer.gateway.flight_sql.parameters import same_kind as _same_kind
from speedlayer.gateway.flight_sql.service import FlightSqlService
from speedlayer.gateway.flight_sql.statements import LIMIT_HINT, analyse
from speedlayer.gateway.routing import ReplicaEndpoint, Route
from speedlayer.gateway.server import authenticate, colocated
from speedlayer.protocol.query_parameters import unpack_parameters
from tests.speedlayer.flight_sql_fakes import CallContext as _Context
from tests.speedlayer.flight_sql_fakes import command_descriptor as _descriptor
from tests.speedlayer.flight_sql_fakes import gateway_config as _config

pytestmark = pytest.mark.unit


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


# ---- statements ------------------------------------------------------------------------------


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


def test_statements_differing_only_in_filter_literals_share_a_shape():
    def shape(sql: str) -> str:
        return analyse(sql, "acme").shape

    assert shape("SELECT * FROM orders WHERE id = 5 AND day = 'a' LIMIT 10") == \
        shape("SELECT *  FROM orders WHERE id = 61234 AND day = 'bbb' LIMIT 3")
    assert shape("SELECT day, count(*) FROM orders GROUP BY day HAVING count(*) > 1") == \
        shape("SELECT day, count(*) FROM orders GROUP BY day HAVING count(*) > 100")
    assert shape("SELECT 5 AS x FROM orders") != shape("SELECT 5000000000 AS x FROM orders")  # INTEGER vs BIGINT
    assert shape("SELECT id FROM orders WHERE id = 5") != shape("SELECT day FROM orders WHERE id = 5")


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


# ---- parameters ------------------------------------------------------------------------------


def test_parameters_travel_as_typed_values_and_bad_ones_are_refused():
    batch = pa.record_batch({
        "i": [7], "s": ["it's"], "f": [0.25], "b": [True], "d": [datetime.date(2024, 1, 2)],
        "t": pa.array([datetime.datetime(2024, 1, 2, 3, 4, 5)], pa.timestamp("us")), "n": pa.array([None], pa.int64()),
        "x": [b"\x00\xff"], "m": pa.array([decimal.Decimal("1.50")], pa.decimal128(5, 2)),
    })
    values = unpack_parameters(parameter_values(batch, 9))
    assert values == {"1": 7, "2": "it's", "3": 0.25, "4": True, "5": datetime.date(2024, 1, 2),
                      "6": datetime.datetime(2024, 1, 2, 3, 4, 5), "7": None, "8": b"\x00\xff",
                      "9": decimal.Decimal("1.50")}
    with pytest.raises(InvalidRequestError, match="takes 2 parameter\\(s\\); 1 were bound"):
        parameter_values(pa.record_batch({"a": [1]}), 2)
    with pytest.raises(InvalidRequestError, match="one row of parameters"):
        parameter_values(pa.record_batch({"a": [1, 2]}), 1)
    with pytest.raises(InvalidRequestError, match="parameter 1 \\('a'\\): type list<item: int64> is not supported"):
        parameter_values(pa.record_batch({"a": [[1]]}), 1)


def test_a_value_with_quotes_semicolons_and_unicode_is_bound_as_a_value_never_sql():
    """Issue 41: values were written into the statement's text with hand-written quoting; now the
    text has `$n` and DuckDB binds the values, so no value can change what the statement does."""
    import duckdb

    from speedlayer.protocol.query_parameters import bound

    statement = analyse("SELECT count(*) AS n FROM orders WHERE day = ? OR note = ?", "acme")
    assert statement.bound_sql == "SELECT count(*) AS n FROM orders WHERE day = $1 OR note = $2"
    hostile = "x' OR '1'='1'; DROP TABLE orders; -- ☃ \\'"
    packed = parameter_values(pa.record_batch({"a": [hostile], "b": ["日本語 \"; --"]}), 2)
    connection = duckdb.connect()
    connection.execute("CREATE TABLE orders AS SELECT * FROM (VALUES ('x', 'a'), (?, 'b'), ('c', ?)) t(day, note)",
                       [hostile, "日本語 \"; --"])
    sql = statement.bound_sql
    assert connection.sql(sql, params=bound(sql, packed)).fetchall() == [(2,)]
    assert connection.sql("SELECT count(*) FROM orders").fetchall() == [(3,)]
    assert bound("SELECT count(*) FROM orders WHERE note = $2", packed) == {"2": "日本語 \"; --"}  # a rewrite's subset
    with pytest.raises(InvalidRequestError, match="names parameter\\(s\\) \\$3"):
        bound("SELECT $3", packed)


def test_parameter_schema_types_parameters_by_the_columns_they_meet():
    columns = pa.schema([("id", pa.int64()), ("day", pa.string())])
    statement = analyse("SELECT * FROM orders WHERE id = ? AND day IN (?, ?) AND ? + 1 > 2 LIMIT ?", "acme")
    assert parameter_schema(statement, columns).types == [pa.int64(), pa.string(), pa.string(), pa.string(), pa.int64()]


def test_date_and_time_parameters_are_announced_in_the_units_the_jdbc_driver_writes():
    """Issue 41: the JDBC driver wrote a Timestamp's epoch milliseconds into the microseconds the
    gateway announced for a `ts` column (apache/arrow-java#838): `ts >= ?` matched every row."""
    columns = pa.schema([("ts", pa.timestamp("us", "UTC")), ("ntz", pa.timestamp("ns")), ("d", pa.date64()),
                         ("t", pa.time64("us"))])
    statement = analyse("SELECT * FROM events WHERE ts >= ? AND ntz < ? AND d = ? AND t > ?", "acme")
    assert parameter_schema(statement, columns).types == [pa.timestamp("ms"), pa.timestamp("ms"), pa.date32(),
                                                          pa.time32("ms")]


def test_a_wall_clock_timestamp_against_a_zoned_column_becomes_an_instant_in_the_callers_zone_or_is_refused():
    columns = pa.schema([("ts", pa.timestamp("us", "UTC")), ("ntz", pa.timestamp("us"))])
    statement = analyse("SELECT * FROM events WHERE ts >= ? AND ntz >= ?", "acme")
    wall = datetime.datetime(2024, 1, 29, 12, 0)
    bound = pa.table({"a": pa.array([wall], pa.timestamp("ms")), "b": pa.array([wall], pa.timestamp("ms"))})
    in_kolkata = in_zone(bound, statement, columns, "Asia/Kolkata")
    assert in_kolkata.column(0).type == pa.timestamp("ms", "Asia/Kolkata")
    assert in_kolkata.column(0)[0].as_py().astimezone(datetime.timezone.utc) == \
        datetime.datetime(2024, 1, 29, 6, 30, tzinfo=datetime.timezone.utc)
    assert in_kolkata.column(1) == bound.column(1)  # a wall-clock column compares wall-clock times
    with pytest.raises(InvalidRequestError, match="parameter 1 is a timestamp without a time zone .*timeZone="):
        in_zone(bound, statement, columns, None)
    with pytest.raises(InvalidRequestError, match="time zone 'Mars/Base'"):
        in_zone(bound, statement, columns, "Mars/Base")
    aware = bound.set_column(0, "a", pa.array([wall], pa.timestamp("ms", "UTC")))
    assert in_zone(aware, statement, columns, None) == aware  # an instant already


def test_zoned_timestamps_are_labelled_with_the_callers_zone_and_keep_their_instants():
    """Issue 41: the JDBC driver read a UTC column back as the wall-clock time of a JVM outside UTC
    (`result_zone`); labelled in the caller's zone, the same instants reach every client."""
    from speedlayer.gateway.flight_sql.result_zone import checked_zone, conformed, conformed_table, in_caller_zone

    instants = pa.array([0, 1_700_000_000_000_000], pa.timestamp("us", "UTC"))
    batch = pa.record_batch([instants, pa.array([0, 1], pa.timestamp("us")), pa.array([1, 2])], ["ts", "ntz", "n"])
    schema = in_caller_zone(batch.schema, "Asia/Kolkata")
    assert schema.types == [pa.timestamp("us", "Asia/Kolkata"), pa.timestamp("us"), pa.int64()]
    assert in_caller_zone(batch.schema, None) is batch.schema
    (relabelled,) = conformed([batch], schema)
    assert relabelled.schema == schema and relabelled.column(0).cast(pa.int64()) == instants.cast(pa.int64())
    assert conformed_table([batch], schema).column(0).to_pylist() == instants.to_pylist()  # equal aware datetimes
    assert checked_zone("Europe/Vienna") == "Europe/Vienna" and checked_zone("") is None
    with pytest.raises(InvalidRequestError, match="time zone 'Mars/Olympus' .*: not a time zone name"):
        checked_zone("Mars/Olympus")


def test_an_answer_announced_ahead_goes_out_under_the_announced_names_when_only_names_differ():
    """`SELECT ts, ts` is probed as a subquery, where DuckDB renames the second column ts_1 (the
    name a client is told at prepare and GetFlightInfo): its answer, which came back as ts, ts, was
    refused as UNAVAILABLE "differ from those announced" (every JDBC statement now waits at DoGet)."""
    from concurrent.futures import Future

    from speedlayer.gateway.flight_sql.held import Later

    answer = pa.record_batch([pa.array([1]), pa.array([1])], names=["ts", "ts"])
    announced = pa.schema([("ts", pa.int64()), ("ts_1", pa.int64())])
    for batches in ([answer], iter([answer])):
        future: Future = Future()
        future.set_result((answer.schema, batches))
        assert [b.schema for b in Later(future, announced, lambda: None).wait()] == [announced]
    future = Future()
    future.set_result((pa.schema([("ts", pa.string())]), [pa.record_batch([pa.array(["x"])], names=["ts"])]))
    with pytest.raises(ReplicaUnavailableError, match="differ from those announced"):
        Later(future, pa.schema([("ts", pa.int64())]), lambda: None).wait()


def test_a_statements_schema_is_known_ahead_only_when_its_parameters_filter():
    assert analyse("SELECT * FROM orders WHERE id = ? LIMIT ?", "acme").fixed_schema
    assert analyse("SELECT day FROM orders GROUP BY day HAVING count(*) > ?", "acme").fixed_schema
    assert not analyse("SELECT ? AS x FROM orders", "acme").fixed_schema
    assert not analyse("SELECT coalesce(day, ?) FROM orders WHERE id = ?", "acme").fixed_schema
    assert _same_kind(pa.utf8(), pa.large_string()) and _same_kind(pa.int64(), pa.float64())
    assert _same_kind(pa.null(), pa.int32()) and _same_kind(pa.date32(), pa.timestamp("us"))
    assert not _same_kind(pa.utf8(), pa.int64()) and not _same_kind(pa.int64(), pa.utf8())


# ---- routing and joins -----------------------------------------------------------------------


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

    def run_sql(self, tenant, dataset, sql, client_id, epoch=None, joined=(), joined_epochs=(), parameters="", query_id=""):
        self.runs.append((sql, epoch, tuple(joined), tuple(joined_epochs)))
        if "syntax" in sql.split("LIMIT 0")[-1]:  # nothing follows the probe's LIMIT 0
            raise InvalidQueryError("Parser Error: syntax error")
        return self.schema, [pa.record_batch([pa.array([len(self.runs)])], schema=self.schema)]

    def relay(self, batches, tenant, started, context):
        return batches

    def watching_caller(self, context, query_id):
        return contextlib.nullcontext()


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


def test_dictionary_columns_are_asked_for_as_their_values_and_refused_by_name():
    from speedlayer.gateway.dictionary_columns import cast_to_values, dictionary_columns, refusal

    schema = pa.schema([("e", pa.dictionary(pa.int8(), pa.string())), ("id", pa.int64()),
                        ('we"ird', pa.dictionary(pa.int16(), pa.string()))])
    encoded = dictionary_columns(schema)
    assert [f.name for f in encoded] == ["e", 'we"ird']
    assert cast_to_values("SELECT * FROM t -- a comment", encoded) == (
        'SELECT * REPLACE (CAST("e" AS VARCHAR) AS "e", CAST("we""ird" AS VARCHAR) AS "we""ird") '
        "FROM (SELECT * FROM t -- a comment\n) AS speedlayer_values")
    assert refusal(encoded).startswith("the result's column(s) 'e', 'we\"ird' are dictionary-encoded (an ENUM)")


def test_flight_sql_statuses_name_their_type_not_a_traceback():
    """Formatted by pyarrow (from native code) they name their type; from Python, as usual."""
    import traceback

    from speedlayer.errors import InvalidQueryError, NotFoundError, ReadOnlyError, ResultTooLargeError
    from speedlayer.gateway.flight_sql.status import InvalidArgument, NotFound, Unimplemented, flight_sql_error

    for error, cls in ((InvalidQueryError("bad"), InvalidArgument), (ResultTooLargeError("max_rows=5"), InvalidArgument),
                       (NotFoundError("no 'x'"), NotFound), (ReadOnlyError("read-only"), Unimplemented)):
        sent = flight_sql_error(error)
        assert type(sent) is cls and str(sent) == str(error)  # NotFound: no KeyError quotes
        try:
            raise sent
        except Exception as exc:
            assert traceback.format_exception(type(exc), exc, exc.__traceback__)[-1].endswith(f"{str(error)}\n")


def test_a_parameterised_statement_on_a_sharded_dataset_is_pruned_merged_and_gathered_with_its_values():
    """Issue 41: with values bound by DuckDB (not written into the text), the shard rewrite keeps
    `$n`s: each shard, the merge and the gather bind the values their text names, and a partition
    column compared with a parameter still prunes shards."""
    import time

    import duckdb

    from speedlayer.gateway.routing import ShardRoute
    from speedlayer.gateway.scatter import ShardScatter
    from speedlayer.protocol.query import QueryLimits, QueryRequest
    from speedlayer.protocol.query_parameters import bound

    rows = pa.table({"id": list(range(60)), "day": [f"d{i % 3}" for i in range(60)], "amount": [i * 0.5 for i in range(60)]})
    whole = duckdb.connect()
    whole.register("orders", rows)
    parts = [whole.sql(f"SELECT * FROM orders WHERE day = 'd{i}'").to_arrow_table() for i in range(3)]
    asked: list[str] = []

    def forward(route, request, limits, deadline):  # each shard binds its text's values, as a worker does
        asked.append(route.epoch)
        connection = duckdb.connect()
        connection.register("orders", parts[int(route.epoch[-1])])
        answer = connection.sql(request.sql, params=bound(request.sql, request.parameters)).to_arrow_table()
        return answer.schema, answer.to_batches()

    shards = tuple(ShardRoute(f"v0-x.s{i}", {"day": [f"d{i}"]}, (ReplicaEndpoint(f"w{i}", f"h:{i}"),), 100)
                   for i in range(3))
    route = Route("acme", "orders", "v0-x", 0, (), shards)
    scatter = ShardScatter(forward, lambda tenant: 1 << 20)

    def run(sql: str, values: dict) -> list[dict]:
        statement = analyse(sql, "acme")
        packed = parameter_values(pa.record_batch({k: [v] for k, v in values.items()}), statement.parameter_count)
        request = QueryRequest("orders", statement.bound_sql, parameters=packed)
        return scatter.run(route, request, QueryLimits(), time.monotonic() + 30).to_pylist()

    try:
        assert run("SELECT count(*) AS n, sum(amount) AS s FROM orders WHERE day = ?", {"a": "d1"}) == \
            [{"n": 20, "s": sum(i * 0.5 for i in range(1, 60, 3))}]
        assert asked == ["v0-x.s1"]  # pruned by the bound value
        asked.clear()
        assert run("SELECT day, count(*) AS n FROM orders WHERE id < ? GROUP BY day HAVING count(*) > ? ORDER BY day",
                   {"a": 40, "b": 13}) == [{"day": "d0", "n": 14}]  # HAVING's $2 is bound in the merge
        assert sorted(asked) == ["v0-x.s0", "v0-x.s1", "v0-x.s2"]
        assert run("SELECT median(id) AS m FROM orders WHERE id >= ? AND day <> ?", {"a": 30, "b": "it's; --"}) == \
            [{"m": 44.5}]  # gathered: the shards' fetch and the gateway's query bind $1 and $2
    finally:
        scatter.close()
