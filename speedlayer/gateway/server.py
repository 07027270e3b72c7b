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
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
import threading
import time
from typing import Iterator

import pyarrow as pa
import pyarrow.flight as flight

from speedlayer.config import GatewayConfig
from speedlayer.errors import (
    InvalidRequestError, NotFoundError, QueryTimeoutError, ReplicaUnavailableError, SpeedLayerError,
    UnauthenticatedError,
)
from speedlayer.gateway.routing import ReplicaEndpoint, Route, RoutingTable
from speedlayer.keys import valid_id
from speedlayer.observability.metrics import GATEWAY_QUERIES, GATEWAY_QUERY_SECONDS, GATEWAY_RETRIES
from speedlayer.protocol.query import (
    AUTH_HEADER, CLIENT_HEADER, DEADLINE_SLACK_S, HEADERS_MIDDLEWARE, TENANT_HEADER, HeadersMiddlewareFactory,
    QueryLimits, QueryRequest, call_headers, call_options, from_flight, location, to_flight,
)

logger = logging.getLogger(__name__)


class GatewayFlightServer(flight.FlightServerBase):
    """Serves queries on `config.address` (port 0: any free port, see `.port`)."""

    def __init__(self, config: GatewayConfig, routing: RoutingTable) -> None:
        super().__init__(location(config.address), middleware={HEADERS_MIDDLEWARE: HeadersMiddlewareFactory()})
        self.config = config
        self.routing = routing
        self.limits = QueryLimits(config.max_result_rows, config.max_result_bytes, config.query_timeout_ms)
        self._clients: dict[str, flight.FlightClient] = {}
        self._lock = threading.Lock()

    def shutdown(self) -> None:
        super().shutdown()
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

    def do_get(self, context: flight.ServerCallContext, ticket: flight.Ticket) -> flight.FlightDataStream:
        started = time.perf_counter()
        tenant = "?"
        try:
            request = QueryRequest.from_ticket(ticket.ticket)
            headers = call_headers(context)
            tenant = authenticate(headers, self.config)
            if not valid_id(request.dataset):
                raise InvalidRequestError(f"dataset {request.dataset!r}: not a dataset id")
            limits = self.limits.effective(request)
            deadline = time.monotonic() + limits.timeout_ms / 1000
            client_id = headers.get(CLIENT_HEADER) or context.peer().rsplit(":", 1)[0]
            route = self.routing.route(tenant, request.dataset, client_id, request.epoch or None)
            schema, batches = self._forward(route, request, limits, deadline)
        except SpeedLayerError as exc:
            GATEWAY_QUERIES.labels(tenant=tenant, outcome=exc.status_name).inc()
            logger.info("query refused or failed: %s", exc, extra={"tenant_id": tenant})
            raise to_flight(exc) from exc
        return flight.GeneratorStream(schema, self._relay(batches, tenant, started, context))

    def _forward(self, route: Route, request: QueryRequest, limits: QueryLimits,
                 deadline: float) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
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

    def _ask(self, replica: ReplicaEndpoint, tenant: str, request: QueryRequest,
             remaining_s: float) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
        """Start the query on one replica and read up to the retry buffer of its answer."""
        options = call_options(tenant, timeout_s=remaining_s + DEADLINE_SLACK_S)
        buffered: list[pa.RecordBatch] = []
        try:
            reader = self._client(replica.address).do_get(flight.Ticket(request.to_ticket()), options=options)
            schema = reader.schema
            size = 0
            while size <= self.config.retry_buffer_bytes:
                try:
                    batch = reader.read_chunk().data
                except StopIteration:
                    return schema, iter(buffered)
                buffered.append(batch)
                size += batch.nbytes
        except (flight.FlightError, pa.ArrowException, OSError) as exc:
            raise from_flight(exc) from exc
        return schema, _chain(buffered, reader)

    def _relay(self, batches: Iterator[pa.RecordBatch], tenant: str, started: float,
               context: flight.ServerCallContext) -> Iterator[pa.RecordBatch]:
        outcome = "OK"
        try:
            for batch in batches:
                if context.is_cancelled():
                    outcome = "CANCELLED"
                    return
                yield batch
        except SpeedLayerError as exc:
            outcome = exc.status_name
            raise to_flight(exc) from exc
        finally:
            GATEWAY_QUERIES.labels(tenant=tenant, outcome=outcome).inc()
            GATEWAY_QUERY_SECONDS.observe(time.perf_counter() - started)


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


def _chain(buffered: list[pa.RecordBatch], reader: flight.FlightStreamReader) -> Iterator[pa.RecordBatch]:
    """The buffered batches, then the rest of a replica's stream (errors as speed layer errors)."""
    yield from buffered
    while True:
        try:
            yield reader.read_chunk().data
        except StopIteration:
            return
        except (flight.FlightError, pa.ArrowException, OSError) as exc:
            reader.cancel()
            raise from_flight(exc) from exc


def _worth_another_replica(error: SpeedLayerError) -> bool:
    """Failures of this replica, not of the query: unreachable, overloaded, or not (yet) serving
    the epoch. Errors any replica would give (SQL, limits, deadlines, tenancy) are not."""
    return error.retriable or isinstance(error, NotFoundError) or type(error) is SpeedLayerError
