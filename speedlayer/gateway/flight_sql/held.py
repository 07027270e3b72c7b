"""The gateway's short-lived Flight SQL statement state: `PreparedStatements` (handles a
client creates, binds and closes), `PendingResults` (an answer awaiting its `DoGet`) and
`AnswersAhead` (a prepared statement started when its values are bound, before the client asks
for it), and the answers they hold (`Streamed`, `Later`).

Each is bounded, per tenant and in all, and expires, so a client that never closes or never
reads costs the gateway a bounded amount of memory and no tenant exhausts or evicts another's;
an answer evicted, expired or refused is released (its worker stream closed, or its
computation cancelled).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import pyarrow as pa

from speedlayer.errors import GatewayStateExhaustedError, NotFoundError, ReplicaUnavailableError
from speedlayer.gateway.flight_sql.statements import Statement


@dataclass(frozen=True)
class Binding:
    """A prepared statement's bound values, replaced whole by each DoPut (read without a lock)."""

    values: str | None = None  # bound by DoPut (packed, see `parameters.parameter_values`); None until then
    # The bound values are of the kinds of the columns they are compared with (no conversion
    # that could fail on the worker), so the answer's errors can only be the worker's.
    values_fit_columns: bool = False


@dataclass
class PreparedStatement:
    tenant: str
    statement: Statement
    bound: Binding = field(default_factory=Binding)
    last_used: float = field(default_factory=time.monotonic)


class PreparedStatements:
    """Open prepared statements by handle; a handle is its tenant's only, and is forgotten after
    `idle_s` without use or when its tenant has more than `per_tenant` open (the tenant's least
    recently used first). More than `capacity` open in all is refused: no tenant evicts another's."""

    def __init__(self, idle_s: float = 1800.0, capacity: int = 10_000, per_tenant: int = 1_000) -> None:
        self.idle_s = idle_s
        self.capacity = capacity
        self.per_tenant = per_tenant
        self._open: OrderedDict[bytes, PreparedStatement] = OrderedDict()
        self._lock = threading.Lock()

    def create(self, tenant: str, statement: Statement) -> bytes:
        handle = secrets.token_bytes(16)
        with self._lock:
            self._expire()
            own = [key for key, prepared in self._open.items() if prepared.tenant == tenant]
            for key in own[:max(0, len(own) - self.per_tenant + 1)]:
                del self._open[key]
            if len(self._open) >= self.capacity:
                raise GatewayStateExhaustedError(f"{len(self._open)} prepared statements are open at this gateway: "
                                                 f"close some (ClosePreparedStatement) and prepare again")
            self._open[handle] = PreparedStatement(tenant, statement)
        return handle

    def get(self, tenant: str, handle: bytes) -> PreparedStatement:
        with self._lock:
            self._expire()
            prepared = self._open.get(handle)
            if prepared is None or prepared.tenant != tenant:
                raise NotFoundError(f"unknown prepared statement handle {handle.hex()[:32]!r} (closed, expired after "
                                    f"{self.idle_s:.0f} s idle, or never created): prepare the statement again")
            prepared.last_used = time.monotonic()
            self._open.move_to_end(handle)
            return prepared

    def close(self, tenant: str, handle: bytes) -> None:
        """Forget `handle`. Idempotent: closing an unknown or expired handle (a gateway restarted,
        a driver closing twice) is not an error, and another tenant's handle is left alone."""
        with self._lock:
            prepared = self._open.get(handle)
            if prepared is not None and prepared.tenant == tenant:
                del self._open[handle]

    def _expire(self) -> None:
        cutoff = time.monotonic() - self.idle_s
        while self._open:
            handle, oldest = next(iter(self._open.items()))
            if oldest.last_used > cutoff:
                return
            del self._open[handle]


@dataclass
class _Pending:
    tenant: str
    schema: pa.Schema
    batches: Iterable[pa.RecordBatch]
    expires: float


class PendingResults:
    """Answers computed at `GetFlightInfo` awaiting their `DoGet`: read once, by the same tenant,
    within `ttl_s`. More than `per_tenant` waiting for a tenant, or `capacity` in all, is refused
    (clients that never read): each holds up to the gateway's retry buffer of answer. An answer
    expired or refused is released (its worker stream closed, or its computation cancelled)."""

    def __init__(self, ttl_s: float = 60.0, capacity: int = 256, per_tenant: int = 64) -> None:
        self.ttl_s = ttl_s
        self.capacity = capacity
        self.per_tenant = per_tenant
        self._waiting: dict[bytes, _Pending] = {}
        self._lock = threading.Lock()

    def put(self, tenant: str, schema: pa.Schema, batches: Iterable[pa.RecordBatch], ttl_s: float | None = None) -> bytes:
        handle = secrets.token_bytes(16)
        now = time.monotonic()
        with self._lock:
            expired = self._expire(now)
            own = sum(1 for pending in self._waiting.values() if pending.tenant == tenant)
            full = len(self._waiting) >= self.capacity or own >= self.per_tenant
            if not full:
                self._waiting[handle] = _Pending(tenant, schema, batches, now + (ttl_s or self.ttl_s))
        for pending in expired:
            release(pending.batches)
        if full:
            release(batches)
            where = f"for tenant {tenant!r}" if own >= self.per_tenant else "at this gateway"
            raise GatewayStateExhaustedError(f"{own if own >= self.per_tenant else len(self._waiting)} statement "
                                             f"results are waiting to be read (DoGet) {where}; read or abandon them first")
        return handle

    def take(self, tenant: str, handle: bytes) -> tuple[pa.Schema, Iterable[pa.RecordBatch]]:
        with self._lock:
            expired = self._expire(time.monotonic())
            pending = self._waiting.get(handle)
            if pending is not None and pending.tenant == tenant:
                del self._waiting[handle]
        for old in expired:
            release(old.batches)
        if pending is None or pending.tenant != tenant:
            raise NotFoundError(f"unknown statement handle {handle.hex()[:32]!r}: a result is read once, within "
                                f"{self.ttl_s:.0f} s of GetFlightInfo; execute the statement again")
        return pending.schema, pending.batches

    def __len__(self) -> int:
        with self._lock:
            expired = self._expire(time.monotonic())
            held = len(self._waiting)
        for pending in expired:
            release(pending.batches)
        return held

    def _expire(self, now: float) -> list[_Pending]:
        """The answers past their time, no longer held (the caller releases them, unlocked)."""
        keys = [key for key, pending in self._waiting.items() if pending.expires <= now]
        return [self._waiting.pop(key) for key in keys]


@dataclass
class StartedAnswer:
    """A statement started ahead: for which tenant and bound values, pinned to which epochs (of
    the dataset it is routed by, then of those it joins), its answer to come (`future`: schema
    and batches)."""

    tenant: str
    values: str  # the bound values, packed ("" for none)
    epochs: tuple[str, ...]
    query_id: str  # the gateway's id for it on the worker (stopped when a waiting caller goes)
    future: Future
    expires: float


class AnswersAhead:
    """Prepared statements started before their `GetFlightInfo`: when a client binds values
    (`DoPut`), or prepares a statement that takes none, the gateway starts it at once on a small
    pool, so the worker's query overlaps the client's next round trips. `take` hands it to the
    `GetFlightInfo` of the same statement handle, tenant and values (one answer per handle).
    At most `capacity` are held, `per_tenant` for one tenant (more are not started), for at most
    `ttl_s`; one not taken is dropped: cancelled if not begun, else its stream closed."""

    def __init__(self, capacity: int = 32, ttl_s: float = 30.0, threads: int = 4, per_tenant: int = 8) -> None:
        self.capacity = capacity
        self.per_tenant = per_tenant
        self.ttl_s = ttl_s
        self._started: dict[bytes, StartedAnswer] = {}
        # Reentrant: a future already done when its callback is added calls `_finished` at once,
        # in `start`, which holds the lock.
        self._lock = threading.RLock()
        self._threads = threads
        self._unfinished = 0  # submitted to the pool and not done (held or taken)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="flight-sql-ahead")

    def start(self, handle: bytes, tenant: str, values: str, epochs: tuple[str, ...], query_id: str,
              run: Callable[[], tuple[pa.Schema, Iterable[pa.RecordBatch]]], only_if_idle: bool = False) -> bool:
        """Start `run` (the statement with `values`, on `epochs`) for `handle`, replacing an answer
        started for it before; False (nothing started) while `capacity` are held, or with
        `only_if_idle` while every thread of the pool has work."""
        now = time.monotonic()
        with self._lock:
            dropped = self._expire(now)
            previous = self._started.pop(handle, None)
            if previous is not None:
                dropped.append(previous)
            own = sum(1 for answer in self._started.values() if answer.tenant == tenant)
            started = (len(self._started) < self.capacity and own < self.per_tenant
                       and not (only_if_idle and self._unfinished >= self._threads))
            if started:
                future = self._pool.submit(run)
                self._unfinished += 1
                future.add_done_callback(self._finished)
                self._started[handle] = StartedAnswer(tenant, values, epochs, query_id, future, now + self.ttl_s)
        for answer in dropped:
            drop(answer.future)
        return started

    def _finished(self, _: Future) -> None:
        with self._lock:
            self._unfinished -= 1

    def take(self, handle: bytes, tenant: str, values: str) -> StartedAnswer | None:
        """The answer started for `handle` with these `values` by `tenant`, no longer held here;
        None if there is none (never started, other values, expired: dropped)."""
        with self._lock:
            dropped = self._expire(time.monotonic())
            answer = self._started.pop(handle, None)
        if answer is not None and (answer.tenant != tenant or answer.values != values):
            dropped.append(answer)
            answer = None
        for old in dropped:
            drop(old.future)
        return answer

    def discard(self, handle: bytes) -> None:
        with self._lock:
            answer = self._started.pop(handle, None)
        if answer is not None:
            drop(answer.future)

    def __len__(self) -> int:
        with self._lock:
            dropped = self._expire(time.monotonic())
            held = len(self._started)
        for answer in dropped:
            drop(answer.future)
        return held

    def _expire(self, now: float) -> list[StartedAnswer]:
        """The answers past their time, no longer held (the caller drops them, unlocked)."""
        keys = [key for key, answer in self._started.items() if answer.expires <= now]
        return [self._started.pop(key) for key in keys]

    def close(self) -> None:
        with self._lock:
            held, self._started = list(self._started.values()), {}
        for answer in held:
            drop(answer.future)
        self._pool.shutdown(wait=False, cancel_futures=True)


def release(batches: Iterable[pa.RecordBatch]) -> None:
    """Give up an answer never read: close its stream (`Later`: drop its computation); a plain
    list or iterator holds nothing to release."""
    close = getattr(batches, "close", None)
    if callable(close):
        close()


def drop(future: Future) -> None:
    """Give up an answer: cancel it if it has not begun, else close its stream once it is there."""
    def close(done: Future) -> None:
        if not done.cancelled() and done.exception() is None:
            batches = done.result()[1]
            if hasattr(batches, "close"):
                batches.close()

    if not future.cancel():
        future.add_done_callback(close)


class Streamed:
    """A pending statement's batches (relayed with the gateway's query metrics at DoGet); a list
    when the answer is complete."""

    def __init__(self, batches: Iterable[pa.RecordBatch]) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return iter(self.batches)

    def close(self) -> None:
        """Close the worker's stream (an answer never read)."""
        release(self.batches)


class Later:
    """A statement's answer still being computed, announced with `schema` (its shape's on the
    answer's epoch); `DoGet` waits for it (within the statement's deadline)."""

    def __init__(self, future: Any, schema: pa.Schema, forget_schema: Callable[[], Any], query_id: str = "") -> None:
        self.future, self.schema, self._forget_schema = future, schema, forget_schema
        self.query_id = query_id  # the gateway's id for it on the worker (stopped if DoGet's caller goes)

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return iter(self.wait())

    def close(self) -> None:
        """Give up the answer (never read): cancelled if not begun, else its stream closed."""
        drop(self.future)

    def wait(self) -> Streamed:
        schema, batches = self.future.result()
        if schema.equals(self.schema):
            return Streamed(batches)
        if schema.types == self.schema.types:
            # Only names differ: the probe ran the statement as a subquery, where DuckDB tells
            # repeated names apart (`SELECT ts, ts` announced as ts, ts_1, which the client was
            # also told at prepare): the answer goes out under the announced names.
            return Streamed(_renamed(batches, self.schema))
        self._forget_schema()  # not expected (same shape, same epoch); the next execution re-probes
        if isinstance(batches, list):
            try:
                return Streamed(pa.Table.from_batches(batches, schema).cast(self.schema).to_batches())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
                pass
        release(batches)
        raise ReplicaUnavailableError(f"the answer's columns ({schema}) differ from those announced for the "
                                      f"statement ({self.schema}): execute it again")


def _renamed(batches: Iterable[pa.RecordBatch], schema: pa.Schema) -> Iterable[pa.RecordBatch]:
    """`batches` under `schema`'s names (same types); a list stays a list (a complete answer)."""
    renamed = (pa.RecordBatch.from_arrays(batch.columns, schema=schema) for batch in batches)
    return list(renamed) if isinstance(batches, list) else renamed
