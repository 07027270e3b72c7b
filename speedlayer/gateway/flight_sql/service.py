"""The gateway's Flight SQL calls: metadata, statements, prepared statements.

A statement is executed when the client asks for its `FlightInfo` (`GetFlightInfo`), the way
the native path executes at `DoGet`: routed to a READY replica of the dataset's newest epoch,
pinned to that epoch, with the gateway's limits, deadline, retries and the worker's SQL guard.
The answer's first part (up to the retry buffer) is then waiting, under a one-time handle in
the FlightInfo's ticket, for the client's `DoGet`. So a client pays one extra round trip, not a
second execution, and the FlightInfo carries the answer's exact schema.

A prepared statement starts earlier: when its values are bound (`DoPut`), or when it is
prepared if it takes none (`AnswersAhead`), pinned to the dataset's newest READY epoch then;
its `GetFlightInfo` takes that answer when it is for the same values and that epoch is still
the newest. If the answer is still being computed and the statement's result schema is known
for its shape on that epoch (no parameter outside a filter), the FlightInfo is sent at once
with that schema and `DoGet` waits for the answer, so the worker's query overlaps the
client's round trips. A complete answer is streamed by `DoGet` without Python per batch.

Errors reach Flight SQL clients with the standard gRPC codes and their message, never a
traceback (`status`): a refused or malformed statement or command, or a result over its limit,
is INVALID_ARGUMENT, an unknown handle NOT_FOUND, writes and transactions UNIMPLEMENTED
(read-only), and the rest as on the native path (UNAUTHENTICATED, PERMISSION_DENIED,
UNAVAILABLE for a dataset with no READY epoch yet: retry, DEADLINE_EXCEEDED), also when the
error comes while the answer streams.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Callable, ContextManager, Iterable, Iterator, Protocol, TypeVar

import pyarrow as pa
import pyarrow.flight as flight

from speedlayer.api import flight_sql_pb2 as sql_pb2
from speedlayer.config import GatewayConfig
from speedlayer.errors import (
    InvalidRequestError, NotFoundError, ReplicaUnavailableError, SpeedLayerError,
)
from speedlayer.gateway.caller_watch import new_query_id
from speedlayer.gateway.flight_sql import catalog
from speedlayer.gateway.flight_sql.auth import SessionTokens, call_tenant
from speedlayer.gateway.flight_sql.column_metadata import described
from speedlayer.gateway.flight_sql.messages import (
    ACTION_CLOSE_PREPARED, ACTION_CREATE_PREPARED, READ_ONLY_ACTIONS, ReadOnlyError, UnsupportedCommandError, pack,
    unpack, unpack_as,
)
from speedlayer.gateway.flight_sql.held import (
    AnswersAhead, Binding, Later, PendingResults, PreparedStatement, PreparedStatements, StartedAnswer, Streamed, drop,
)
from speedlayer.gateway.flight_sql.parameters import (
    TIME_ZONE_HEADER, in_zone, merged, parameter_schema, parameter_values, values_fit_columns,
)
from speedlayer.gateway.flight_sql.result_zone import checked_zone, conformed, conformed_table, in_caller_zone
from speedlayer.gateway.flight_sql.statements import Statement, analyse
from speedlayer.gateway.flight_sql.status import flight_sql_error
from speedlayer.gateway.routing import RoutingTable
from speedlayer.observability.metrics import GATEWAY_QUERIES, GATEWAY_QUERY_SECONDS
from speedlayer.protocol.query import CLIENT_HEADER, call_headers

logger = logging.getLogger(__name__)

SERVER_VERSION = "0.1.0"
SCHEMA_CACHE_SIZE = 4096
# How long an answer started ahead (at DoPut or prepare) waits for its GetFlightInfo: a client
# executing a statement asks at once; one asking later gets a fresh execution instead.
AHEAD_TTL_S = 2.0
T = TypeVar("T")


class StatementRunner(Protocol):
    """What the service needs of the gateway: run SQL on one dataset (routed, pinned, limited)."""

    config: GatewayConfig
    routing: RoutingTable

    def run_sql(self, tenant: str, dataset: str, sql: str, client_id: str, epoch: str | None = None,
                joined: tuple[str, ...] = (), joined_epochs: tuple[str | None, ...] = (), parameters: str = "",
                query_id: str = "") -> tuple[pa.Schema, Iterable[pa.RecordBatch]]: ...

    def sharded_schema(self, tenant: str, dataset: str, sql: str, client_id: str,
                       epoch: str | None = None) -> pa.Schema: ...

    def watching_caller(self, context: flight.ServerCallContext, query_id: str) -> ContextManager[None]: ...

    def relay(self, batches: Iterable[pa.RecordBatch], tenant: str, started: float,
              context: flight.ServerCallContext,
              translate: Callable[[SpeedLayerError], Exception]) -> Iterator[pa.RecordBatch]: ...


def _translated(method: Callable[..., T]) -> Callable[..., T]:
    @functools.wraps(method)
    def call(self: "FlightSqlService", *args: Any) -> T:
        try:
            return method(self, *args)
        except SpeedLayerError as exc:
            GATEWAY_QUERIES.labels(tenant="?", outcome=exc.status_name).inc()
            logger.info("Flight SQL call refused or failed: %s", exc)
            raise flight_sql_error(exc) from None
    return call


class FlightSqlService:
    """Answers the Flight SQL calls of `GatewayFlightServer` (see the module docstring)."""

    def __init__(self, gateway: StatementRunner, authenticate: Callable[[dict[str, str], GatewayConfig], str]) -> None:
        self.gateway = gateway
        self.sessions = SessionTokens(gateway.config)
        self._authenticate = authenticate
        self.prepared = PreparedStatements()
        self.pending = PendingResults(ttl_s=gateway.config.query_timeout_ms / 1000 + 60)
        self.ahead = AnswersAhead(ttl_s=AHEAD_TTL_S)
        self._schemas: dict[tuple[str, str, str], pa.Schema] = {}
        self._probed: dict[tuple[str, str, tuple[str, ...]], pa.Schema] = {}

    # ---- calls ------------------------------------------------------------------------------

    @_translated
    def get_flight_info(self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor) -> flight.FlightInfo:
        tenant, client_id = self._caller(context)
        command = unpack(descriptor.command or b"", "GetFlightInfo")
        schema, batches, is_statement = self._answer(context, tenant, client_id, command)
        if is_statement:
            schema = in_caller_zone(described(schema), _zone(context))
            if not isinstance(batches, Later):
                batches = Streamed(batches)
        handle = self.pending.put(tenant, schema, batches)  # refused: released there
        ticket = pack(sql_pb2.TicketStatementQuery(statement_handle=handle))
        return flight.FlightInfo(schema, descriptor, [flight.FlightEndpoint(ticket, [])], -1, -1)

    @_translated
    def get_schema(self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor) -> flight.SchemaResult:
        tenant, client_id = self._caller(context)
        command = unpack(descriptor.command or b"", "GetSchema")
        if isinstance(command, sql_pb2.CommandStatementQuery):
            statement = analyse(command.query, tenant)
        elif isinstance(command, sql_pb2.CommandPreparedStatementQuery):
            statement = self.prepared.get(tenant, command.prepared_statement_handle).statement
        else:
            return flight.SchemaResult(self._metadata(tenant, client_id, command).schema)
        return flight.SchemaResult(in_caller_zone(described(self._probe_schema(tenant, client_id, statement)),
                                                  _zone(context)))

    @_translated
    def do_get(self, context: flight.ServerCallContext, ticket: bytes) -> flight.FlightDataStream:
        started = time.perf_counter()
        tenant, _ = self._caller(context)
        message = unpack_as(ticket, sql_pb2.TicketStatementQuery, "DoGet ticket")
        schema, batches = self.pending.take(tenant, message.statement_handle)
        if isinstance(batches, Later):
            with self.gateway.watching_caller(context, batches.query_id):
                batches = batches.wait()
        if isinstance(batches, Streamed):
            if isinstance(batches.batches, list):  # the whole answer is here: streamed without Python
                GATEWAY_QUERIES.labels(tenant=tenant, outcome="OK").inc()
                GATEWAY_QUERY_SECONDS.observe(time.perf_counter() - started)
                return flight.RecordBatchStream(conformed_table(batches.batches, schema))
            return flight.GeneratorStream(schema, self.gateway.relay(conformed(batches.batches, schema), tenant,
                                                                     started, context, flight_sql_error))
        return flight.GeneratorStream(schema, batches)

    @_translated
    def do_put(self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor,
               reader: flight.MetadataRecordBatchReader, writer: flight.FlightMetadataWriter) -> None:
        tenant, client_id = self._caller(context)
        command = unpack(descriptor.command or b"", "DoPut")
        if not isinstance(command, sql_pb2.CommandPreparedStatementQuery):
            raise InvalidRequestError(f"DoPut: {command.DESCRIPTOR.name} takes no data; DoPut binds the parameters "
                                      f"of a prepared statement (CommandPreparedStatementQuery)")
        prepared = self.prepared.get(tenant, command.prepared_statement_handle)
        parameters = reader.read_all()
        columns = self._columns(tenant, client_id, prepared.statement)
        if columns is not None:
            parameters = in_zone(parameters, prepared.statement, columns, call_headers(context).get(TIME_ZONE_HEADER))
        values = parameter_values(parameters, prepared.statement.parameter_count)
        fits = columns is not None and values_fit_columns(prepared.statement, columns, parameters.schema)
        prepared.bound = Binding(values, fits)  # one object, replaced at once: never half of a binding
        # Started once this handler has no more Python to run but its reply (measured: no difference).
        self._run_ahead(tenant, client_id, command.prepared_statement_handle, prepared)
        result = sql_pb2.DoPutPreparedStatementResult(prepared_statement_handle=command.prepared_statement_handle)
        writer.write(pa.py_buffer(result.SerializeToString()))

    @_translated
    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> list[flight.Result]:
        # Closing only frees the gateway's state: a client whose session expired may still close
        # its statements (drivers close them on the way out and would fail their close otherwise).
        tenant, client_id = self._caller(context, allow_expired=action.type == ACTION_CLOSE_PREPARED)
        body = action.body.to_pybytes() if action.body is not None else b""
        if action.type == ACTION_CREATE_PREPARED:
            request = unpack_as(body, sql_pb2.ActionCreatePreparedStatementRequest, action.type)
            return [flight.Result(pack(self._prepare(tenant, client_id, request, _zone(context))))]
        if action.type == ACTION_CLOSE_PREPARED:
            request = unpack_as(body, sql_pb2.ActionClosePreparedStatementRequest, action.type)
            self.prepared.close(tenant, request.prepared_statement_handle)
            self.ahead.discard(request.prepared_statement_handle)
            return []
        if action.type in READ_ONLY_ACTIONS:
            raise ReadOnlyError(f"{action.type} is refused: the speed layer is read-only (no transactions)")
        raise UnsupportedCommandError(f"action {action.type!r} is not supported by this server")

    @staticmethod
    def list_actions() -> list[tuple[str, str]]:
        return [(ACTION_CREATE_PREPARED, "prepare a statement (Flight SQL)"),
                (ACTION_CLOSE_PREPARED, "close a prepared statement (Flight SQL)")]

    # ---- commands ---------------------------------------------------------------------------

    def _caller(self, context: flight.ServerCallContext, allow_expired: bool = False) -> tuple[str, str]:
        headers = call_headers(context)
        tenant = call_tenant(headers, self.sessions, self._authenticate, allow_expired=allow_expired)
        return tenant, headers.get(CLIENT_HEADER) or context.peer().rsplit(":", 1)[0]

    def _answer(self, context: flight.ServerCallContext, tenant: str, client_id: str,
                command: Any) -> tuple[pa.Schema, Any, bool]:
        """The schema and batches answering `command`, and whether it ran a statement (stopped on
        its worker if the call of `context` is cancelled meanwhile)."""
        if isinstance(command, sql_pb2.CommandStatementQuery):
            if command.HasField("transaction_id"):
                raise ReadOnlyError("transactions are not supported: the speed layer is read-only")
            statement = analyse(command.query, tenant)
            if statement.parameter_count:
                raise InvalidRequestError(f"the statement has {statement.parameter_count} parameter(s): prepare it "
                                          f"and bind them (a prepared statement)")
            dataset, joined = statement.targets()
            query_id = new_query_id()
            with self.gateway.watching_caller(context, query_id):
                return (*self.gateway.run_sql(tenant, dataset, statement.render(), client_id, joined=joined,
                                              query_id=query_id), True)
        if isinstance(command, sql_pb2.CommandPreparedStatementQuery):
            prepared = self.prepared.get(tenant, command.prepared_statement_handle)
            statement, bound = prepared.statement, prepared.bound
            if statement.parameter_count and bound.values is None:
                raise InvalidRequestError(f"the prepared statement takes {statement.parameter_count} parameter(s) "
                                          f"and none were bound (DoPut)")
            values, handle = bound.values or "", command.prepared_statement_handle
            answer = self.ahead.take(handle, tenant, values)
            at_doget = waits_at_doget(context)
            if answer is None and at_doget and self._run_ahead(tenant, client_id, handle, prepared, only_if_idle=True):
                answer = self.ahead.take(handle, tenant, values)  # started now, so that DoGet waits, not this call
            if answer is not None:
                # Values of the columns' kinds: nothing the worker could refuse that it would not
                # refuse with other values, so the error may come from DoGet. A JDBC caller sees
                # DoGet's errors from executeQuery as it would GetFlightInfo's.
                fits = at_doget or (bool(statement.parameter_count) and bound.values_fit_columns)
                held = self._started_answer(context, tenant, client_id, statement, answer, fits, fresh=at_doget)
                if held is not None:
                    return (*held, True)
            dataset, joined = statement.targets()
            query_id = new_query_id()
            with self.gateway.watching_caller(context, query_id):
                return (*self.gateway.run_sql(tenant, dataset, statement.bound_sql, client_id, joined=joined,
                                              parameters=values, query_id=query_id), True)
        table = self._metadata(tenant, client_id, command)
        return table.schema, iter(table.to_batches()), False

    def _metadata(self, tenant: str, client_id: str, command: Any) -> pa.Table:
        if isinstance(command, sql_pb2.CommandGetSqlInfo):
            return catalog.sql_info(list(command.info), SERVER_VERSION, self.gateway.config.query_timeout_ms)
        if isinstance(command, sql_pb2.CommandGetCatalogs):
            return catalog.catalogs()
        if isinstance(command, sql_pb2.CommandGetDbSchemas):
            return catalog.db_schemas(tenant, _optional(command, "catalog"), _optional(command, "db_schema_filter_pattern"))
        if isinstance(command, sql_pb2.CommandGetTableTypes):
            return catalog.table_types()
        if isinstance(command, sql_pb2.CommandGetPrimaryKeys):
            return catalog.primary_keys()
        if isinstance(command, (sql_pb2.CommandGetExportedKeys, sql_pb2.CommandGetImportedKeys,
                                sql_pb2.CommandGetCrossReference)):
            return catalog.foreign_keys()
        if isinstance(command, sql_pb2.CommandGetTables):
            names = [n for n in self.gateway.routing.datasets(tenant)
                     if catalog.like(_optional(command, "table_name_filter_pattern"), n)]
            datasets = [catalog.DatasetTable(n, self._newest_schema(tenant, n, client_id) if command.include_schema
                                             else None) for n in names]
            return catalog.tables(tenant, datasets, catalog=_optional(command, "catalog"),
                                  schema_pattern=_optional(command, "db_schema_filter_pattern"),
                                  table_pattern=_optional(command, "table_name_filter_pattern"),
                                  table_types=list(command.table_types), include_schema=command.include_schema)
        raise InvalidRequestError(f"{command.DESCRIPTOR.name} is not a command for GetFlightInfo")

    def _prepare(self, tenant: str, client_id: str, request: sql_pb2.ActionCreatePreparedStatementRequest,
                 zone: str | None) -> sql_pb2.ActionCreatePreparedStatementResult:
        if request.HasField("transaction_id"):
            raise ReadOnlyError("transactions are not supported: the speed layer is read-only")
        statement = analyse(request.query, tenant)
        dataset, joined = statement.targets()
        columns = merged([self._dataset_schema(tenant, name, client_id) for name in (dataset, *joined)])
        result_schema = self._probe_schema(tenant, client_id, statement)
        handle = self.prepared.create(tenant, statement)
        if not statement.parameter_count:  # nothing to bind: it can start now
            self._run_ahead(tenant, client_id, handle, self.prepared.get(tenant, handle))
        return sql_pb2.ActionCreatePreparedStatementResult(
            prepared_statement_handle=handle,
            dataset_schema=in_caller_zone(described(result_schema), zone).serialize().to_pybytes(),
            parameter_schema=parameter_schema(statement, columns).serialize().to_pybytes())

    # ---- statements started ahead -----------------------------------------------------------

    def _run_ahead(self, tenant: str, client_id: str, handle: bytes, prepared: PreparedStatement,
                   only_if_idle: bool = False) -> bool:
        """Start `prepared` with its bound values for the GetFlightInfo that usually follows, pinned
        to the newest READY epoch of each dataset it reads (a join: every one's); whether it was.
        Nothing is started if it cannot be routed now (GetFlightInfo runs it and reports why), nor
        with `only_if_idle` unless a thread of the pool is free to begin it at once."""
        bound = prepared.bound
        values = bound.values or ""
        try:
            dataset, joined = prepared.statement.targets()
            sql = prepared.statement.bound_sql
            epochs = self._newest_epochs(tenant, client_id, (dataset, *joined))
        except SpeedLayerError:
            return False
        query_id = new_query_id()
        return self.ahead.start(handle, tenant, values, epochs, query_id,
                                lambda: self.gateway.run_sql(tenant, dataset, sql, client_id, epochs[0], joined=joined,
                                                             joined_epochs=epochs[1:], parameters=values,
                                                             query_id=query_id), only_if_idle=only_if_idle)

    def _newest_epochs(self, tenant: str, client_id: str, datasets: tuple[str, ...]) -> tuple[str, ...]:
        """The newest READY epoch of each of `datasets` (SpeedLayerError if one has none)."""
        return tuple(self.gateway.routing.route(tenant, name, client_id).epoch for name in datasets)

    def _started_answer(self, context: flight.ServerCallContext, tenant: str, client_id: str, statement: Statement,
                        answer: StartedAnswer, fits: bool, fresh: bool = False) -> tuple[pa.Schema, Any] | None:
        """The schema and batches of an answer started ahead, or None (dropped: run the statement
        now) if it has not begun or its epoch is no longer the dataset's newest READY one. While it
        is being computed, it is a `Later` (DoGet waits for it) if its schema is known before it
        (the statement's shape was probed on that epoch) and the values bound `fits` the columns
        (so the worker can refuse nothing the statement would not refuse with other values: such
        errors still come from GetFlightInfo, as for a statement run then). A `fresh` answer, started
        by this call on a free thread, counts as being computed even before that thread begins it."""
        dataset, joined = statement.targets()
        try:
            newest: tuple[str, ...] | None = self._newest_epochs(tenant, client_id, (dataset, *joined))
        except SpeedLayerError:
            newest = None
        if newest != answer.epochs:
            drop(answer.future)
            return None
        computing = answer.future.running() or (fresh and not answer.future.done())
        if computing and statement.fixed_schema and fits:
            key = (tenant, statement.shape, answer.epochs)
            schema = self._probed.get(key)
            if schema is not None:
                return schema, Later(answer.future, schema, lambda: self._probed.pop(key, None), answer.query_id)
        if answer.future.cancel():  # not begun (the pool is busy): the caller runs it
            return None
        with self.gateway.watching_caller(context, answer.query_id):
            return answer.future.result()

    def _columns(self, tenant: str, client_id: str, statement: Statement) -> pa.Schema | None:
        """The columns of the datasets `statement` reads (their newest READY epochs); None if it
        cannot be routed now (running it says why)."""
        try:
            dataset, joined = statement.targets()
            return merged([self._dataset_schema(tenant, name, client_id) for name in (dataset, *joined)])
        except SpeedLayerError:
            return None

    def close(self) -> None:
        """Drop the answers started ahead and stop their pool (the gateway is shutting down)."""
        self.ahead.close()

    # ---- dataset schemas --------------------------------------------------------------------

    def _probe_schema(self, tenant: str, client_id: str, statement: Statement) -> pa.Schema:
        """The schema of `statement`'s answer, from the statement run with no rows (`LIMIT 0`
        around it, NULL for each parameter) on a worker holding its datasets; on a sharded epoch,
        from the shard plan the statement runs by, run with no rows (`sharded_schema`: a subquery
        around the statement is a shape the shards' merge refuses). Remembered per statement
        shape and epochs: drivers prepare every statement they run (ADBC, JDBC), and a
        dashboard's statements differ mostly in their filters' literals, which change no column."""
        dataset, joined = statement.targets()
        routes = [self.gateway.routing.route(tenant, name, client_id) for name in (dataset, *joined)]
        epochs = tuple(route.epoch for route in routes)
        key = (tenant, statement.shape, epochs)
        schema = self._probed.get(key)
        if schema is not None:
            return schema
        if routes[0].shards and not joined:  # a join on a sharded epoch is refused by run_sql, naming it
            sql = statement.render(("NULL",) * statement.parameter_count)
            schema = self.gateway.sharded_schema(tenant, dataset, sql, client_id, epochs[0])
        else:
            schema, batches = self.gateway.run_sql(tenant, dataset, probe_sql(statement), client_id, epochs[0],
                                                   joined=joined, joined_epochs=epochs[1:])
            for _ in batches:
                pass
        if len(self._probed) >= SCHEMA_CACHE_SIZE:
            self._probed.clear()
        self._probed[key] = schema
        return schema

    def _dataset_schema(self, tenant: str, dataset: str, client_id: str) -> pa.Schema:
        """The Arrow schema of the dataset's newest READY epoch (cached per epoch)."""
        epoch = self.gateway.routing.route(tenant, dataset, client_id).epoch
        key = (tenant, dataset, epoch)
        schema = self._schemas.get(key)
        if schema is None:
            quoted = '"' + dataset.replace('"', '""') + '"'
            schema, batches = self.gateway.run_sql(tenant, dataset, f"SELECT * FROM {quoted} LIMIT 0", client_id, epoch)
            for _ in batches:
                pass
            if len(self._schemas) >= SCHEMA_CACHE_SIZE:
                self._schemas.clear()
            self._schemas[key] = schema
        return schema

    def _newest_schema(self, tenant: str, dataset: str, client_id: str) -> pa.Schema | None:
        try:
            return self._dataset_schema(tenant, dataset, client_id)
        except (ReplicaUnavailableError, NotFoundError):  # no READY epoch yet: listed with an empty schema
            return None


def probe_sql(statement: Statement) -> str:
    """`statement` (NULL for each parameter) returning no rows: its answer's schema only. The
    statement's text ends at its last token (`analyse` cut the `;`s and comments after it), so it
    closes as a subquery; the closing parenthesis still goes on a line of its own."""
    probe = statement.render(("NULL",) * statement.parameter_count)
    return f"SELECT * FROM ({probe}\n) AS speedlayer_probe LIMIT 0"


def waits_at_doget(context: flight.ServerCallContext) -> bool:
    """Whether the caller is on grpc-java: the Arrow Flight SQL JDBC driver (DBeaver, Spark's
    JDBC reader) can neither cancel nor time out a GetFlightInfo (`Statement.cancel()` waits for
    it, Avatica holding the statement's lock through it, and `setQueryTimeout` bounds only the
    wait for the answer's stream), so its statements' GetFlightInfo announces the answer and DoGet
    waits for it, where both act. ADBC and other callers cancel or time out the GetFlightInfo
    itself, so theirs still waits for the answer there (their query timeout bounds it)."""
    return call_headers(context).get("user-agent", "").startswith("grpc-java")


def _zone(context: flight.ServerCallContext) -> str | None:
    """The caller's time zone (`result_zone`), checked."""
    return checked_zone(call_headers(context).get(TIME_ZONE_HEADER))


def _optional(message: Any, name: str) -> str | None:
    return getattr(message, name) if message.HasField(name) else None
