"""The worker's query surface (seed: "Query Surface"): SQL over the epochs it serves, over Flight.

One `DoGet` per query (`speedlayer.protocol.query`). The query pins one published epoch
(`ServedDatasets.pin`) and runs on its own DuckDB cursor, on which a TEMP VIEW named after
the dataset is bound to that epoch's table: the SQL says `FROM orders` and reads exactly one
complete epoch, whatever the freshness work publishes meanwhile. Only a single SELECT (or
WITH ... SELECT) statement that reads nothing but its dataset is run (`sql_guard`); its `$n`
parameters are bound by DuckDB to the request's values (`protocol.query_parameters`). A query may
name `joined` datasets too, each with its epoch: each is pinned and bound the same way, and
they are all the statement may read besides its dataset.

Results stream as Arrow record batches. The first batch is computed before the call returns,
so that errors (bad SQL, a deadline) reach the caller before any data and a gateway can
still retry elsewhere; a result passing its row or byte limit fails mid-stream with
`ResultTooLargeError`. A watchdog thread interrupts DuckDB when a query's deadline passes, its
caller cancels, or the gateway asks (`CANCEL_ACTION`: the gateway's own caller has gone). The worker serves one tenant: a call naming another is refused.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator

import pyarrow as pa
import pyarrow.flight as flight

from speedlayer.errors import (
    InvalidQueryError, InvalidRequestError, QueryCancelledError, QueryTimeoutError, ResultTooLargeError, SpeedLayerError,
    TenantIsolationError, UnauthenticatedError,
)
from speedlayer.protocol.query import (
    CANCEL_ACTION, HEADERS_MIDDLEWARE, TENANT_HEADER, HeadersMiddlewareFactory, QueryLimits, QueryRequest, batch_bytes,
    call_headers, to_flight,
)
from speedlayer.protocol.query_parameters import bound
from speedlayer.worker.loader import quote
from speedlayer.worker.serving import EpochPin, ServedDatasets
from speedlayer.worker.sql_guard import check_query
from speedlayer.worker.tail_answer import answer_schema, bind_tail
from speedlayer.worker.tails import PinnedTail, WorkerTails

if TYPE_CHECKING:
    import duckdb

logger = logging.getLogger(__name__)

BATCH_ROWS = 64 * 1024
WATCHDOG_INTERVAL_S = 0.02
# How long a cancelled query id is remembered: a CANCEL_ACTION may overtake its query's DoGet.
CANCELLED_MEMORY_S = 60.0


# DuckDB's error types (its messages begin "<type> Error: ") that are the query's own fault: its
# SQL or its values, which every replica would refuse alike. The others (IO, Out of Memory,
# INTERNAL, ...) may be this worker's, and the gateway tries another replica.
QUERY_FAULTS = frozenset({"Parser", "Syntax", "Binder", "Catalog", "Conversion", "Out of Range", "Mismatch Type",
                          "Divide by Zero", "Decimal", "Invalid type", "Invalid Input", "Not implemented",
                          "Parameter Not Resolved", "Parameter Not Allowed"})


def query_failure(exc: Exception, dataset: str, epoch: str) -> SpeedLayerError:
    """The error a caller gets for DuckDB's failure `exc` of a query on `dataset`: InvalidQueryError
    if it is the query's fault, else SpeedLayerError. DuckDB's own exceptions tell by their DB-API
    class (ProgrammingError: binder, catalog, parser, invalid input; DataError: conversion, out of
    range; NotSupportedError); a failure found while the batches after the first rows are read
    (a late row's cast) crosses Arrow's C stream and arrives as a plain OSError carrying DuckDB's
    text, so there its message's type tells."""
    import duckdb

    fault = (isinstance(exc, (duckdb.ProgrammingError, duckdb.DataError, duckdb.NotSupportedError))
             or str(exc).split(" Error: ", 1)[0] in QUERY_FAULTS)
    if fault:
        return InvalidQueryError(f"query on dataset {dataset!r} (epoch {epoch}): {exc}")
    return SpeedLayerError(f"query on dataset {dataset!r} (epoch {epoch}) failed: {exc}")


@dataclass
class _Running:
    cursor: duckdb.DuckDBPyConnection
    deadline: float
    # Only while `do_get` runs: a call's context must not be touched once the call may have
    # ended (it is freed with the call), so it is detached before `do_get` returns.
    context: flight.ServerCallContext | None
    query_id: str = ""  # the gateway's id for it (CANCEL_ACTION)
    reason: str = ""  # "timeout" or "cancelled" once interrupted
    # time.monotonic() (CLOCK_MONOTONIC: one clock for every process of the host) when its
    # interrupt was first asked: how long a stopped query held the worker is measured from it.
    interrupted_at: float = 0.0


@dataclass
class QueryWatchdog:
    """Interrupts running queries past their deadline or whose caller has gone."""

    interval_s: float = WATCHDOG_INTERVAL_S
    _running: dict[int, _Running] = field(default_factory=dict)
    _cancelled: dict[str, float] = field(default_factory=dict)  # query id -> when its cancel came
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._run, name="query-watchdog", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def watch(self, running: _Running) -> int:
        """Watch `running` until `unwatch`; one whose id was cancelled already starts as cancelled."""
        with self._lock:
            if running.query_id and running.query_id in self._cancelled:
                running.reason, running.interrupted_at = "cancelled", time.monotonic()
            token = id(running)
            self._running[token] = running
            return token

    def unwatch(self, token: int) -> None:
        with self._lock:
            self._running.pop(token, None)

    def detach_context(self, token: int) -> None:
        with self._lock:
            running = self._running.get(token)
            if running is not None:
                running.context = None

    def cancel(self, query_id: str) -> int:
        """Interrupt the running queries with `query_id` (their caller has gone), and any that starts
        with it within CANCELLED_MEMORY_S; how many were running."""
        now = time.monotonic()
        with self._lock:
            if query_id:
                self._cancelled = {q: at for q, at in self._cancelled.items() if now - at < CANCELLED_MEMORY_S}
                self._cancelled[query_id] = now
            found = [query for query in self._running.values() if query_id and query.query_id == query_id]
            for query in found:
                if not query.reason:
                    query.reason, query.interrupted_at = "cancelled", now
                    self._interrupt(query)
        return len(found)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            now = time.monotonic()
            # Checked under the lock: unwatch/detach (before the call ends) wait for it.
            with self._lock:
                for query in self._running.values():
                    if query.reason:  # again: an interrupt that came before DuckDB began the query is lost
                        self._interrupt(query)
                    else:
                        self._check(query, now)

    @staticmethod
    def _check(query: _Running, now: float) -> None:
        if now >= query.deadline:
            query.reason = "timeout"
        elif query.context is not None and query.context.is_cancelled():
            query.reason = "cancelled"
        else:
            return
        query.interrupted_at = now
        QueryWatchdog._interrupt(query)

    @staticmethod
    def _interrupt(query: _Running) -> None:
        try:
            query.cursor.interrupt()
        except Exception:  # the query may have just finished
            logger.debug("interrupt failed", exc_info=True)


class WorkerFlightServer(flight.FlightServerBase):
    """Serves `served`'s epochs to callers of tenant `tenant`; `cursor()` opens a DuckDB cursor."""

    def __init__(self, location: str, *, tenant: str, served: ServedDatasets, cursor: Callable[[], duckdb.DuckDBPyConnection],
                 limits: QueryLimits | None = None, tails: WorkerTails | None = None) -> None:
        super().__init__(location, middleware={HEADERS_MIDDLEWARE: HeadersMiddlewareFactory()})
        self.tenant = tenant
        self.served = served
        self.tails = tails
        self._cursor = cursor
        self.limits = limits or QueryLimits()
        self.watchdog = QueryWatchdog()
        self.watchdog.start()

    def shutdown(self) -> None:
        self.watchdog.stop()
        super().shutdown()

    def do_get(self, context: flight.ServerCallContext, ticket: flight.Ticket) -> flight.FlightDataStream:
        try:
            request = QueryRequest.from_ticket(ticket.ticket)
            self._check_tenant(call_headers(context).get(TENANT_HEADER, ""))
            schema, batches = self.execute(request, context)
        except SpeedLayerError as exc:
            raise to_flight(exc) from exc
        return flight.GeneratorStream(schema, batches)

    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> list[flight.Result]:
        """CANCEL_ACTION: stop this tenant's queries with the query id in the body (the gateway's
        caller has gone); nothing else is served."""
        try:
            self._check_tenant(call_headers(context).get(TENANT_HEADER, ""))
            if action.type != CANCEL_ACTION:
                raise InvalidRequestError(f"action {action.type!r} is not served by a worker")
        except SpeedLayerError as exc:
            raise to_flight(exc) from exc
        query_id = action.body.to_pybytes().decode() if action.body is not None else ""
        stopped = self.watchdog.cancel(query_id)
        logger.info("cancel of query %s asked by the gateway: %d running query(ies) interrupted", query_id, stopped)
        return []

    def _check_tenant(self, tenant: str) -> None:
        if not tenant:
            raise UnauthenticatedError(f"missing the {TENANT_HEADER} header")
        if tenant != self.tenant:
            raise TenantIsolationError(f"tenant {tenant!r} may not query this worker's datasets")

    def execute(self, request: QueryRequest, context: flight.ServerCallContext
                ) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
        """Bind, plan and compute the first batch; the rest streams from the returned iterator."""
        import duckdb

        check_query(request.sql, request.dataset, tuple(dataset for dataset, _ in request.joined))
        limits = self.limits.effective(request)
        pins, tail = self._pin_all(request)
        held: list[EpochPin | PinnedTail] = [*pins, tail] if tail is not None else list(pins)  # released at the end
        cursor = self._cursor()
        running = _Running(cursor, time.monotonic() + limits.timeout_ms / 1000, context, request.query_id)
        token = self.watchdog.watch(running)
        try:
            epoch = pins[0].served.epoch
            try:
                for index, pin in enumerate(pins):
                    served = pin.served
                    cursor.execute(f"CREATE TEMP VIEW {quote(served.dataset)} AS "
                                   f"{bind_tail(served.table, tail if index == 0 else None)}")
            except duckdb.InterruptException as exc:  # the watchdog's interrupt lands on whatever runs
                raise self._interrupted(running, request, limits, epoch) from exc
            if running.reason:  # cancelled before it began (the gateway's CANCEL_ACTION came first)
                raise self._interrupted(running, request, limits, epoch)
            reader = self._run(cursor, request, running, limits, epoch)
            first = self._next(reader, request, running, limits, epoch)
        except BaseException:
            self._finish(token, running, held, cursor)
            raise
        self.watchdog.detach_context(token)
        schema = answer_schema(reader.schema, epoch, tail, request.committed_only)
        return schema, self._stream(first, reader, request, running, limits, epoch, token, held, cursor, schema)

    def _pin_all(self, request: QueryRequest) -> tuple[list[EpochPin], PinnedTail | None]:
        """The query's dataset pinned (its epoch, or the newest) with its tail unless the request
        asks for the committed epoch alone, then each joined one at its epoch."""
        def pin() -> EpochPin:
            return self.served.pin(request.dataset, request.epoch or None)

        tail = None
        if self.tails is None or request.committed_only:
            first = pin()
        else:
            first, tail = self.tails.pin_with_tail(request.dataset, pin, lambda p: p.served.epoch)
        pins = [first]
        try:
            for dataset, epoch in request.joined:
                pins.append(self.served.pin(dataset, epoch))
        except BaseException:
            for pinned in pins:
                pinned.release()
            if tail is not None:
                tail.release()
            raise
        return pins, tail

    def _run(self, cursor, request: QueryRequest, running: _Running, limits: QueryLimits, epoch: str):
        import duckdb

        try:
            relation = cursor.sql(request.sql, params=bound(request.sql, request.parameters))
            # duckdb >= 1.4 names it to_arrow_reader; older releases fetch_arrow_reader.
            to_reader = getattr(relation, "to_arrow_reader", None) or relation.fetch_arrow_reader
            return to_reader(BATCH_ROWS)
        except duckdb.InterruptException as exc:
            raise self._interrupted(running, request, limits, epoch) from exc
        except duckdb.Error as exc:
            raise query_failure(exc, request.dataset, epoch) from exc

    def _next(self, reader, request: QueryRequest, running: _Running, limits: QueryLimits,
              epoch: str) -> pa.RecordBatch | None:
        import duckdb

        try:
            return reader.read_next_batch()
        except StopIteration:
            return None
        except (duckdb.InterruptException, pa.ArrowCancelled) as exc:
            raise self._interrupted(running, request, limits, epoch) from exc
        except (duckdb.Error, pa.ArrowException, OSError) as exc:  # DuckDB's errors past the first rows: OSError
            if running.reason:
                raise self._interrupted(running, request, limits, epoch) from exc
            raise query_failure(exc, request.dataset, epoch) from exc

    @staticmethod
    def _interrupted(running: _Running, request: QueryRequest, limits: QueryLimits, epoch: str) -> SpeedLayerError:
        error: SpeedLayerError
        if running.reason == "cancelled":
            error = QueryCancelledError(f"query on dataset {request.dataset!r} was cancelled by its caller")
        else:
            error = QueryTimeoutError(f"query on dataset {request.dataset!r} (epoch {epoch}) exceeded its deadline "
                                      f"of {limits.timeout_ms} ms")
        logger.info("query %s interrupted: %s", request.query_id or "(no id)", error)
        return error

    def _stream(self, first, reader, request: QueryRequest, running: _Running, limits: QueryLimits, epoch: str,
                token: int, held: list[EpochPin | PinnedTail], cursor, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
        rows = size = 0
        batch = first
        relabel = schema.metadata != reader.schema.metadata
        try:
            while batch is not None:
                rows, size = rows + batch.num_rows, size + batch_bytes(batch)
                if rows > limits.max_rows or size > limits.max_bytes:
                    raise to_flight(ResultTooLargeError(
                        f"result of the query on dataset {request.dataset!r} exceeds its limit "
                        f"(max_rows={limits.max_rows}, max_bytes={limits.max_bytes}; at least {rows} rows, "
                        f"{size} bytes): select fewer rows or columns, or aggregate"))
                yield pa.RecordBatch.from_arrays(batch.columns, schema=schema) if relabel else batch
                try:
                    batch = self._next(reader, request, running, limits, epoch)
                except SpeedLayerError as exc:
                    raise to_flight(exc) from exc
        finally:
            self._finish(token, running, held, cursor)

    def _finish(self, token: int, running: _Running, held: list[EpochPin | PinnedTail], cursor) -> None:
        """The query has ended: its cursor closed, its epochs and tail released."""
        self.watchdog.unwatch(token)
        try:
            cursor.close()
        finally:
            for pinned in held:
                pinned.release()
        if running.reason:
            # What an operator (and the cancellation tests) read: how long an interrupted query
            # still held this worker, on the host's monotonic clock.
            freed = time.monotonic()
            logger.info("query %s %s: freed %.1f ms after its interrupt was asked (monotonic %.6f)",
                        running.query_id or "(no id)", running.reason, (freed - running.interrupted_at) * 1000, freed)
