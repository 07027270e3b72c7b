"""The Data Gateway (seed layer 2): one Flight endpoint for (tenant, dataset, SQL) queries.

Each `DoGet` is authenticated (the tenant header, and a token where configured), routed by
`RoutingTable` to a READY replica of the dataset's newest epoch, and forwarded to that
worker with the epoch pinned in the ticket, so the answer comes from exactly the epoch the
gateway chose. A replica that fails before its answer is complete, with `UNAVAILABLE`, a
broken connection, or "epoch not served" (a worker restarted), is marked suspect and the next
replica is tried within the query's deadline. To make that possible for the common case, the
first `retry_buffer_bytes` of an answer are read before anything is sent on; a longer answer
then streams through and cannot be retried once it has started. Errors that would be the same
on any replica (bad SQL, limits, deadline, another tenant's dataset) are returned at once.
A sharded epoch's query goes to one replica of each shard that may hold matching rows, each
retried like this, and the partial answers are merged here (`scatter`); a query whose shape does
not combine from partial answers is run here on the rows it needs, gathered from those shards,
when they fit the tenant's `gather_max_bytes`.

The same service speaks Arrow Flight SQL (`speedlayer.gateway.flight_sql`): a ticket that is
not the native JSON, every `GetFlightInfo`, `GetSchema`, `DoPut` and `DoAction`, and the
`Handshake` with basic credentials are Flight SQL's, and run their statements through the same
routing, limits and retries (`run_sql`). With `tls_cert_file` the service listens on TLS.
"""

from __future__ import annotations

import dataclasses
import hmac
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
import logging
import threading
import time
from typing import Callable, ContextManager, Iterable, Iterator

import pyarrow as pa
import pyarrow.flight as flight

from speedlayer.config import GatewayConfig
from speedlayer.errors import (
    InvalidQueryError, InvalidRequestError, NotFoundError, QueryTimeoutError, ReplicaUnavailableError, SpeedLayerError,
    UnauthenticatedError,
)
from speedlayer.gateway.caller_watch import CallerWatch, new_query_id
from speedlayer.gateway.dictionary_columns import cast_to_values, dictionary_columns, refusal
from speedlayer.gateway.flight_sql.auth import AUTH_MIDDLEWARE, AcceptingAuthHandler, BasicAuthMiddlewareFactory
from speedlayer.gateway.flight_sql.service import FlightSqlService
from speedlayer.gateway.routing import ReplicaEndpoint, Route, RoutingTable
from speedlayer.gateway.scatter import ShardScatter
from speedlayer.keys import valid_id
from speedlayer.observability.metrics import GATEWAY_QUERIES, GATEWAY_QUERY_SECONDS, GATEWAY_RETRIES
from speedlayer.protocol.query import (
    AUTH_HEADER, CANCEL_ACTION, CLIENT_HEADER, DEADLINE_SLACK_S, HEADERS_MIDDLEWARE, TENANT_HEADER, HeadersMiddlewareFactory,
    QueryLimits, QueryRequest, call_headers, call_options, from_flight, location, to_flight,
)

logger = logging.getLogger(__name__)

MAX_CANCELS_IN_FLIGHT = 8  # CANCEL_ACTIONs sent at once (a query's shards' workers)


class GatewayFlightServer(flight.FlightServerBase):
    """Serves queries on `config.address` (port 0: any free port, see `.port`)."""

    def __init__(self, config: GatewayConfig, routing: RoutingTable) -> None:
        self.config = config
        self.routing = routing
        self.flight_sql = FlightSqlService(self, authenticate)
        middleware = {HEADERS_MIDDLEWARE: HeadersMiddlewareFactory(),
                      AUTH_MIDDLEWARE: BasicAuthMiddlewareFactory(self.flight_sql.sessions)}
        super().__init__(_listen_location(config), auth_handler=AcceptingAuthHandler(), middleware=middleware,
                         **_tls_options(config))
        self.limits = QueryLimits(config.max_result_rows, config.max_result_bytes, config.query_timeout_ms)
        self._clients: dict[str, flight.FlightClient] = {}
        self._lock = threading.Lock()
        # query id -> (worker address, tenant) of each call to a worker it has open (`_ask`)
        self._in_flight: dict[str, list[tuple[str, str]]] = {}
        self.caller_watch = CallerWatch(self._cancel_query)
        # Every worker of a query told at once (a sharded query runs on several): one after
        # another, each round trip waited for the last on a busy host.
        self._cancels = ThreadPoolExecutor(MAX_CANCELS_IN_FLIGHT, thread_name_prefix="cancel-query")
        self.scatter = ShardScatter(self._forward, lambda tenant: routing.tenant_config(tenant).gather_max_bytes)

    def shutdown(self) -> None:
        super().shutdown()
        self.caller_watch.stop()
        self._cancels.shutdown(wait=False, cancel_futures=True)
        self.flight_sql.close()
        self.scatter.close()
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()

    def _client(self, address: str) -> flight.FlightClient:
        with self._lock:
            client = self._clients.get(address)
            if client is None:
                client = self._clients[address] = flight.connect(location(address))
            return client

    # ---- Flight SQL (speedlayer.gateway.flight_sql) -------------------------------------------

    def get_flight_info(self, context: flight.ServerCallContext,
                        descriptor: flight.FlightDescriptor) -> flight.FlightInfo:
        return self.flight_sql.get_flight_info(context, descriptor)

    def get_schema(self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor) -> flight.SchemaResult:
        return self.flight_sql.get_schema(context, descriptor)

    def do_put(self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor,
               reader: flight.MetadataRecordBatchReader, writer: flight.FlightMetadataWriter) -> None:
        self.flight_sql.do_put(context, descriptor, reader, writer)

    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> list[flight.Result]:
        return self.flight_sql.do_action(context, action)

    def list_actions(self, context: flight.ServerCallContext) -> list[tuple[str, str]]:
        return self.flight_sql.list_actions()

    # ---- queries ------------------------------------------------------------------------------

    def do_get(self, context: flight.ServerCallContext, ticket: flight.Ticket) -> flight.FlightDataStream:
        if not ticket.ticket.lstrip()[:1] == b"{":  # not the native JSON ticket: Flight SQL's
            return self.flight_sql.do_get(context, ticket.ticket)
        started = time.perf_counter()
        tenant = "?"
        try:
            request = QueryRequest.from_ticket(ticket.ticket)
            headers = call_headers(context)
            tenant = authenticate(headers, self.config)
            client_id = headers.get(CLIENT_HEADER) or context.peer().rsplit(":", 1)[0]
            request = dataclasses.replace(request, query_id=new_query_id())  # the gateway's, never a client's
            with self.caller_watch.watching(context, request.query_id):
                schema, batches = self._run(tenant, request, client_id)
        except SpeedLayerError as exc:
            GATEWAY_QUERIES.labels(tenant=tenant, outcome=exc.status_name).inc()
            logger.info("query refused or failed: %s", exc, extra={"tenant_id": tenant})
            raise to_flight(exc) from exc
        return flight.GeneratorStream(schema, self._relay(batches, tenant, started, context))

    def run_sql(self, tenant: str, dataset: str, sql: str, client_id: str, epoch: str | None = None,
                joined: tuple[str, ...] = (), joined_epochs: tuple[str | None, ...] = (), parameters: str = "",
                query_id: str = "") -> tuple[pa.Schema, Iterable[pa.RecordBatch]]:
        """Run `sql` on `dataset` (its newest READY epoch, or `epoch`) and the `joined` datasets (their
        newest READY epochs, or `joined_epochs`, on a worker holding them all) for an authenticated
        tenant, its `$n` bound to `parameters` (packed values), with the gateway's limits and deadline:
        the answer's schema and batches (Flight SQL's path). `query_id` (`new_query_id`) lets
        `watching_caller` stop it on the workers."""
        request = QueryRequest(dataset=dataset, sql=sql, epoch=epoch or "", parameters=parameters, query_id=query_id)
        if not joined:
            return self._run(tenant, request, client_id)
        for name in (dataset, *joined):
            if not valid_id(name):
                raise InvalidRequestError(f"dataset {name!r}: not a dataset id")
        limits = self.limits.effective(request)
        deadline = time.monotonic() + limits.timeout_ms / 1000
        pinned = (epoch, *joined_epochs, *(None,) * (len(joined) - len(joined_epochs)))
        routes = [self.routing.route(tenant, name, client_id, at or None) for name, at in zip((dataset, *joined), pinned)]
        for sharded in (r for r in routes if r.shards):
            raise InvalidQueryError(f"a join cannot be answered on dataset {sharded.dataset!r}: its epoch "
                                    f"{sharded.epoch} is split into {len(sharded.shards)} shards (joins across "
                                    "shards are not combined at the gateway)")
        route = colocated(routes)
        request = dataclasses.replace(request, joined=tuple((r.dataset, r.epoch) for r in routes[1:]))
        return self._forward(route, request, limits, deadline)

    def sharded_schema(self, tenant: str, dataset: str, sql: str, client_id: str, epoch: str | None = None) -> pa.Schema:
        """The schema of `sql`'s answer on `dataset`'s sharded epoch (`epoch`, else its newest READY
        one), learned from the shard plan without rows (`ShardScatter.schema`), with the gateway's
        limits and deadline; InvalidRequestError if that epoch is not sharded."""
        if not valid_id(dataset):
            raise InvalidRequestError(f"dataset {dataset!r}: not a dataset id")
        request = QueryRequest(dataset=dataset, sql=sql, epoch=epoch or "")
        limits = self.limits.effective(request)
        deadline = time.monotonic() + limits.timeout_ms / 1000
        route = self.routing.route(tenant, dataset, client_id, epoch)
        if not route.shards:
            raise InvalidRequestError(f"dataset {dataset!r}: epoch {route.epoch} is not split into shards")
        return self.scatter.schema(route, request, limits, deadline)

    def watching_caller(self, context: flight.ServerCallContext, query_id: str) -> ContextManager[None]:
        """While the block runs, the query `query_id` is stopped on its workers if the call of
        `context` is cancelled or passes its deadline (`caller_watch`)."""
        return self.caller_watch.watching(context, query_id)

    def relay(self, batches: Iterable[pa.RecordBatch], tenant: str, started: float,
              context: flight.ServerCallContext,
              translate: Callable[[SpeedLayerError], Exception] = to_flight) -> Iterator[pa.RecordBatch]:
        """`batches` sent on, counted in the gateway's query metrics, stopped if the caller cancels;
        an error while they stream raised as `translate` makes it (Flight SQL: its status codes)."""
        return self._relay(batches, tenant, started, context, translate)

    def _run(self, tenant: str, request: QueryRequest, client_id: str) -> tuple[pa.Schema, Iterable[pa.RecordBatch]]:
        if not valid_id(request.dataset):
            raise InvalidRequestError(f"dataset {request.dataset!r}: not a dataset id")
        if request.joined:  # set by the gateway for Flight SQL's joins only, never by a native client
            raise InvalidRequestError("'joined' is not accepted in a native query ticket: a native query reads "
                                      "one dataset (join datasets through Flight SQL)")
        limits = self.limits.effective(request)
        deadline = time.monotonic() + limits.timeout_ms / 1000
        route = self.routing.route(tenant, request.dataset, client_id, request.epoch or None)
        if route.shards:
            merged = self.scatter.run(route, request, limits, deadline)
            return merged.schema, merged.to_batches()
        return self._forward(route, request, limits, deadline)

    def _forward(self, route: Route, request: QueryRequest, limits: QueryLimits,
                 deadline: float) -> tuple[pa.Schema, Iterable[pa.RecordBatch]]:
        failures: list[str] = []
        for attempt, replica in enumerate(route.replicas):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise QueryTimeoutError(f"query on dataset {route.dataset!r} exceeded its deadline of "
                                        f"{limits.timeout_ms} ms (tried {failures})")
            if attempt:
                GATEWAY_RETRIES.labels(tenant=route.tenant).inc()
            forwarded = dataclasses.replace(request, epoch=route.epoch, max_rows=limits.max_rows,
                                            max_bytes=limits.max_bytes, timeout_ms=max(1, int(remaining * 1000)))
            try:
                return self._ask(replica, route.tenant, forwarded, remaining)
            except SpeedLayerError as exc:
                if not _worth_another_replica(exc):
                    raise
                self.routing.suspect(replica.worker)
                failures.append(f"{replica.worker}: {exc}")
                logger.warning("replica %s of %s/%s failed (%s); %s", replica.worker, route.dataset, route.epoch,
                               exc, "trying the next" if attempt + 1 < len(route.replicas) else "no other",
                               extra={"tenant_id": route.tenant})
        raise ReplicaUnavailableError(f"no replica of dataset {route.dataset!r} epoch {route.epoch} answered: "
                                      f"{'; '.join(failures)}")

    def _ask(self, replica: ReplicaEndpoint, tenant: str, request: QueryRequest, remaining_s: float,
             cast: bool = False) -> tuple[pa.Schema, Iterable[pa.RecordBatch]]:
        """Start the query on one replica and read up to the retry buffer of its answer. An
        answer with dictionary-encoded columns is asked for again with them cast to their
        values (`dictionary_columns`, `cast`): its stream would not read, on any replica."""
        options = call_options(tenant, timeout_s=remaining_s + DEADLINE_SLACK_S)
        buffered: list[pa.RecordBatch] = []
        try:
            with self._open_on(replica.address, tenant, request.query_id):
                reader = self._client(replica.address).do_get(flight.Ticket(request.to_ticket()), options=options)
                schema = reader.schema
                encoded = dictionary_columns(schema)
                if encoded:
                    reader.cancel()
                    if cast:
                        raise InvalidQueryError(refusal(encoded))
                    values = dataclasses.replace(request, sql=cast_to_values(request.sql, encoded))
                    return self._ask(replica, tenant, values, remaining_s, cast=True)
                size = 0
                while size <= self.config.retry_buffer_bytes:
                    try:
                        batch = reader.read_chunk().data
                    except StopIteration:
                        return schema, buffered  # the whole answer: a list (Flight SQL streams it from C++)
                    buffered.append(batch)
                    size += batch.nbytes
        except (flight.FlightError, pa.ArrowException, OSError) as exc:
            raise from_flight(exc) from exc
        return schema, _chain(buffered, reader)

    @contextmanager
    def _open_on(self, address: str, tenant: str, query_id: str) -> Iterator[None]:
        """Remember, for the block, that query `query_id` runs on the worker at `address`."""
        if not query_id:
            yield
            return
        with self._lock:
            self._in_flight.setdefault(query_id, []).append((address, tenant))
        try:
            yield
        finally:
            with self._lock:
                calls = self._in_flight[query_id]
                calls.remove((address, tenant))
                if not calls:
                    del self._in_flight[query_id]

    def _cancel_query(self, query_id: str) -> None:
        """Ask each worker running `query_id` (a call to it open) to stop it (`CANCEL_ACTION`), all
        at once; returns when each has answered."""
        with self._lock:
            calls = sorted(set(self._in_flight.get(query_id, ())))
        for done in [self._cancels.submit(self._cancel_on, address, tenant, query_id) for address, tenant in calls]:
            done.result()

    def _cancel_on(self, address: str, tenant: str, query_id: str) -> None:
        action = flight.Action(CANCEL_ACTION, query_id.encode())
        try:
            list(self._client(address).do_action(action, options=call_options(tenant, timeout_s=5)))
        except (flight.FlightError, pa.ArrowException, OSError) as exc:
            logger.info("could not ask %s to stop query %s (it stops at its deadline): %s", address, query_id, exc)

    def _relay(self, batches: Iterable[pa.RecordBatch], tenant: str, started: float,
               context: flight.ServerCallContext,
               translate: Callable[[SpeedLayerError], Exception] = to_flight) -> Iterator[pa.RecordBatch]:
        outcome = "OK"
        try:
            for batch in batches:
                if context.is_cancelled():
                    outcome = "CANCELLED"
                    return
                yield batch
        except SpeedLayerError as exc:
            outcome = exc.status_name
            raise translate(exc) from None
        finally:
            GATEWAY_QUERIES.labels(tenant=tenant, outcome=outcome).inc()
            GATEWAY_QUERY_SECONDS.observe(time.perf_counter() - started)


def _listen_location(config: GatewayConfig) -> str:
    return f"grpc+tls://{config.address}" if config.tls else location(config.address)


def _tls_options(config: GatewayConfig) -> dict:
    """FlightServerBase's TLS arguments: the server certificate, and the CA that signs client
    certificates when they are required."""
    if not config.tls:
        return {}
    with open(config.tls_cert_file, "rb") as cert, open(config.tls_key_file, "rb") as key:  # type: ignore[arg-type]
        options: dict = {"tls_certificates": [(cert.read(), key.read())]}
    if config.tls_client_ca_file:
        with open(config.tls_client_ca_file, "rb") as ca:
            options.update(verify_client=True, root_certificates=ca.read())
    return options


def authenticate(headers: dict[str, str], config: GatewayConfig) -> str:
    """The caller's tenant; UnauthenticatedError without the header or the tenant's token."""
    tenant = headers.get(TENANT_HEADER, "")
    if not valid_id(tenant):
        raise UnauthenticatedError(f"the {TENANT_HEADER} header is missing or not a tenant id: {tenant!r}")
    expected = config.tokens.get(tenant)
    if expected is None:
        if config.require_tokens:
            raise UnauthenticatedError(f"tenant {tenant!r} has no token configured at this gateway")
        return tenant
    presented = headers.get(AUTH_HEADER, "")
    presented = presented[7:].strip() if presented.lower().startswith("bearer ") else ""
    if not hmac.compare_digest(presented.encode(), expected.encode()):
        raise UnauthenticatedError(f"tenant {tenant!r}: missing or wrong token ({AUTH_HEADER}: Bearer ...)")
    return tenant


def colocated(routes: list[Route]) -> Route:
    """The first route narrowed to the replicas whose worker also holds a READY replica of every
    other route's epoch (a statement over several datasets runs on one worker), in the first
    route's order; InvalidQueryError naming the datasets and where they are if there is none."""
    common = set.intersection(*({r.worker for r in route.replicas} for route in routes))
    if not common:
        where = "; ".join(f"{r.dataset} (epoch {r.epoch}) on {', '.join(sorted(x.worker for x in r.replicas))}"
                          for r in routes)
        raise InvalidQueryError(f"datasets {', '.join(r.dataset for r in routes)}: no worker holds READY replicas "
                                f"of all of them ({where}); a statement may join only datasets one worker holds")
    first = routes[0]
    return dataclasses.replace(first, replicas=tuple(r for r in first.replicas if r.worker in common))


def _chain(buffered: list[pa.RecordBatch], reader: flight.FlightStreamReader) -> Iterator[pa.RecordBatch]:
    """The buffered batches, then the rest of a replica's stream (errors as speed layer errors).
    Closed before the end (the caller went, or the answer was dropped), it cancels the replica's
    stream at once, so the worker stops the query then rather than when the reader is collected."""
    finished = False
    try:
        yield from buffered
        while True:
            try:
                yield reader.read_chunk().data
            except StopIteration:
                finished = True
                return
            except (flight.FlightError, pa.ArrowException, OSError) as exc:
                raise from_flight(exc) from exc
    finally:
        if not finished:
            reader.cancel()


def _worth_another_replica(error: SpeedLayerError) -> bool:
    """Failures of this replica, not of the query: unreachable, overloaded, or not (yet) serving
    the epoch. Errors any replica would give (SQL, limits, deadlines, tenancy) are not."""
    return error.retriable or isinstance(error, NotFoundError) or type(error) is SpeedLayerError
