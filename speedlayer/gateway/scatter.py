"""Result aggregation at the gateway: a query on a sharded epoch, scattered and merged.

The shards that cannot hold rows the WHERE clause admits are pruned first. When one shard is
left it holds every row the query can see, so the query runs there as it is (any shape) and its
answer is the answer. Otherwise the query is planned (`shard_query.plan_query`: refused there if
its shape cannot be combined) and one replica of each remaining shard is asked in parallel through the gateway's own forwarding (`forward`: the
shard's replicas in the client's order, retried on the next as for any epoch). Every shard of
one query is of the same epoch: the route pinned it. The partial answers are concatenated and
the merge runs on the gateway's DuckDB (one in-memory database, a connection per query); the
result is held to the query's row and byte limits like a worker's answer.

A shape `plan_query` refuses is gathered instead when the shards left after pruning are
estimated, together, at no more than the tenant's `gather_max_bytes` (`gather_query`), checked
before anything is fetched; otherwise it is refused with both numbers. The dataset's columns are
read once per epoch (`SELECT * ... LIMIT 0` on one shard), each shard's rows the query needs are
fetched in parallel through the same forwarding (per-shard retries, the query's deadline; at most
the limit in bytes from each, and from all), and the query runs in a second DuckDB database of
the gateway, opened without file access, interrupted at the deadline. The answer says so: its
schema's metadata `speedlayer.note` ("gathered 2 of 4 shards ..."), the gateway's log, and
`gateway_shard_gathers_total{tenant,outcome="gathered"|"refused"}`.

A statement's result schema (what Flight SQL clients ask for before running it) is learned the
same way without rows (`schema`): the plan `run` would follow, one shard's part of it with
`LIMIT 0`, and the merge or the gathered query run at the gateway over that empty part. A
subquery around the statement, as on an unsharded epoch, would be a shape `plan_query` refuses.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable

import pyarrow as pa

from speedlayer.errors import InvalidQueryError, QueryTimeoutError, ResultTooLargeError
from speedlayer.gateway.gather_query import GatherPlan, gather_refusal, plan_gather
from speedlayer.gateway.routing import Route, ShardRoute
from speedlayer.gateway.shard_query import PARTIALS, Unshardable, partition_pruning, plan_query, shards_to_ask
from speedlayer.observability.metrics import GATEWAY_SHARD_GATHERS, GATEWAY_SHARDS
from speedlayer.protocol.query import QueryLimits, QueryRequest
from speedlayer.protocol.query_parameters import bound, unpack_parameters

logger = logging.getLogger(__name__)

Forward = Callable[[Route, QueryRequest, QueryLimits, float], tuple[pa.Schema, Iterable[pa.RecordBatch]]]
GatherLimit = Callable[[str], int]  # tenant -> its gather_max_bytes
MAX_PARALLEL_SHARDS = 16  # shard calls in flight at once, over all queries of a gateway
FETCH_MAX_ROWS = 2**62  # a gather's fetch is bounded in bytes (and by the workers' own caps), not rows
SCHEMAS_HELD = 256  # epochs whose column names are remembered
NOTE_KEY = b"speedlayer.note"


class ShardScatter:
    """`run(route, request, limits, deadline)`: the merged (or gathered) answer of a sharded
    route's shards; `gather_limit(tenant)`: the tenant's gather_max_bytes (0: never gather)."""

    def __init__(self, forward: Forward, gather_limit: GatherLimit) -> None:
        self._forward = forward
        self._gather_limit = gather_limit
        self._pool = ThreadPoolExecutor(MAX_PARALLEL_SHARDS, thread_name_prefix="shard-call")
        self._merger: Any = None
        self._gatherer: Any = None
        self._schemas: OrderedDict[tuple[str, str, str], list[str]] = OrderedDict()
        self._lock = threading.Lock()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def run(self, route: Route, request: QueryRequest, limits: QueryLimits, deadline: float) -> pa.Table:
        asked = self._asked(route, request)
        GATEWAY_SHARDS.labels(tenant=route.tenant, outcome="asked").inc(len(asked))
        GATEWAY_SHARDS.labels(tenant=route.tenant, outcome="pruned").inc(len(route.shards) - len(asked))
        if len(asked) == 1:
            return self._answer(route.one_shard(asked[0]), request, limits, deadline)
        try:
            query = plan_query(request.sql, route.dataset, _partition_columns(route))
        except Unshardable as exc:
            return self._gather(route, asked, request, limits, deadline, exc.construct)
        shard_request = dataclasses.replace(request, sql=query.shard_sql)
        partials = self._ask_all(route, asked, shard_request, limits, deadline)
        merged = self._merge(query.merge_sql, pa.concat_tables(partials, promote_options="default"),
                             request.parameters)
        return _within(merged, route, limits)

    def schema(self, route: Route, request: QueryRequest, limits: QueryLimits, deadline: float) -> pa.Schema:
        """The schema of `request`'s answer on `route`'s shards, learned from no rows: the step
        `run` would take (one shard's answer as is, the merge of partial answers, or the query
        run on gathered rows), fed one shard's part of it with `LIMIT 0`. Nothing is gathered and
        nothing refused for its size: a statement too big to gather still has a schema (Flight
        SQL clients ask for it when they prepare a statement), and running it is refused as
        `run` refuses it. Shards are pruned as `run` prunes them, by the same SQL and values."""
        asked = self._asked(route, request)
        first = route.one_shard(asked[0])
        if len(asked) == 1:
            return self._answer(first, _no_rows(request, request.sql), limits, deadline).schema
        try:
            query = plan_query(request.sql, route.dataset, _partition_columns(route))
        except Unshardable:
            plan = plan_gather(request.sql, route.dataset, self._columns(route, asked[0], limits, deadline))
            rows = self._answer(first, _no_rows(request, plan.fetch_sql), limits, deadline)
            return self._run_gathered(plan, route, rows, limits, deadline, request.parameters).schema
        partials = self._answer(first, _no_rows(request, query.shard_sql), limits, deadline)
        return self._merge(query.merge_sql, partials, request.parameters).schema

    @staticmethod
    def _asked(route: Route, request: QueryRequest) -> list[ShardRoute]:
        """The shards that may hold rows `request`'s WHERE clause admits (`shards_to_ask`)."""
        pruning = partition_pruning(request.sql, _partition_columns(route), _pruning_texts(request.parameters))
        return [route.shards[i] for i in shards_to_ask([s.values for s in route.shards], pruning)]

    def _ask_all(self, route: Route, asked: list[ShardRoute], request: QueryRequest, limits: QueryLimits,
                 deadline: float) -> list[pa.Table]:
        calls = [self._pool.submit(self._answer, route.one_shard(shard), request, limits, deadline)
                 for shard in asked]
        return [call.result(timeout=max(0.001, deadline - time.monotonic()) + 1.0) for call in calls]

    def _gather(self, route: Route, asked: list[ShardRoute], request: QueryRequest, limits: QueryLimits,
                deadline: float, construct: str) -> pa.Table:
        """`request` run whole at the gateway on the `asked` shards' rows, if they fit the limit."""
        needed, limit = sum(s.estimated_bytes for s in asked), self._gather_limit(route.tenant)
        refusal = gather_refusal(construct, route.dataset, route.epoch, len(route.shards), len(asked), needed, limit)
        if refusal is not None:
            GATEWAY_SHARD_GATHERS.labels(tenant=route.tenant, outcome="refused").inc()
            raise InvalidQueryError(refusal)
        plan = plan_gather(request.sql, route.dataset, self._columns(route, asked[0], limits, deadline))
        fetch_limits = QueryLimits(FETCH_MAX_ROWS, limit, limits.timeout_ms)
        try:
            parts = self._ask_all(route, asked, dataclasses.replace(request, sql=plan.fetch_sql), fetch_limits,
                                  deadline)
        except ResultTooLargeError as exc:
            raise ResultTooLargeError(f"gathering dataset {route.dataset!r}'s shards for {construct}: {exc} (each "
                                      f"shard's rows are fetched within the gather limit, {limit} bytes, and the "
                                      "workers' own answer caps)") from exc
        rows = pa.concat_tables(parts, promote_options="default")
        if rows.nbytes > limit:
            raise ResultTooLargeError(
                f"gathering dataset {route.dataset!r}'s {len(asked)} shards for {construct} read {rows.nbytes} bytes, "
                f"more than the gather limit of {limit} bytes (their estimate was {needed})")
        note = (f"gathered {len(asked)} of {len(route.shards)} shards of epoch {route.epoch} ({rows.num_rows} rows, "
                f"{rows.nbytes} bytes; columns {', '.join(plan.columns) or 'none'}; "
                f"{'WHERE pushed down' if plan.filtered else 'every row'}) and ran the query at the gateway: "
                f"{construct} does not combine from the shards' answers")
        answer = _within(self._run_gathered(plan, route, rows, limits, deadline, request.parameters), route, limits)
        GATEWAY_SHARD_GATHERS.labels(tenant=route.tenant, outcome="gathered").inc()
        logger.info("query on %s: %s", route.dataset, note, extra={"tenant_id": route.tenant})
        return answer.replace_schema_metadata({**(answer.schema.metadata or {}), NOTE_KEY: note.encode()})

    def _columns(self, route: Route, shard: ShardRoute, limits: QueryLimits, deadline: float) -> list[str]:
        """The dataset's column names at `route`'s epoch (asked of one shard once, then remembered)."""
        key = (route.tenant, route.dataset, route.epoch)
        with self._lock:
            if key in self._schemas:
                return self._schemas[key]
        probe = QueryRequest(dataset=route.dataset, sql=f'SELECT * FROM "{route.dataset}" LIMIT 0')
        names = self._answer(route.one_shard(shard), probe, limits, deadline).column_names
        with self._lock:
            self._schemas[key] = names
            while len(self._schemas) > SCHEMAS_HELD:
                self._schemas.popitem(last=False)
        return names

    def _run_gathered(self, plan: GatherPlan, route: Route, rows: pa.Table, limits: QueryLimits,
                      deadline: float, parameters: str) -> pa.Table:
        import duckdb

        with self._lock:
            if self._gatherer is None:  # a user's SQL runs here: no files, like a worker's view of one dataset
                self._gatherer = duckdb.connect(":memory:", config={"enable_external_access": False})
            connection = self._gatherer.cursor()
        timer = threading.Timer(max(0.0, deadline - time.monotonic()), connection.interrupt)
        timer.start()
        try:
            connection.register(route.dataset, rows)
            return connection.sql(plan.local_sql, params=bound(plan.local_sql, parameters)).to_arrow_table()
        except duckdb.InterruptException as exc:
            raise QueryTimeoutError(f"query on dataset {route.dataset!r} exceeded its deadline of "
                                    f"{limits.timeout_ms} ms while running on the gathered shards") from exc
        except duckdb.Error as exc:
            raise InvalidQueryError(f"query on dataset {route.dataset!r} (epoch {route.epoch}, gathered at the "
                                    f"gateway): {exc}") from exc
        finally:
            timer.cancel()
            connection.close()

    def _answer(self, route: Route, request: QueryRequest, limits: QueryLimits, deadline: float) -> pa.Table:
        if deadline <= time.monotonic():
            raise QueryTimeoutError(f"query on dataset {route.dataset!r} exceeded its deadline of "
                                    f"{limits.timeout_ms} ms before shard {route.epoch} was asked")
        schema, batches = self._forward(route, request, limits, deadline)
        return pa.Table.from_batches(list(batches), schema)

    def _merge(self, sql: str, partials: pa.Table, parameters: str) -> pa.Table:
        with self._lock:
            if self._merger is None:
                import duckdb

                self._merger = duckdb.connect(":memory:")
            connection = self._merger.cursor()
        try:
            connection.register(PARTIALS, partials)
            return connection.sql(sql, params=bound(sql, parameters)).to_arrow_table()
        except Exception as exc:  # DuckDB's errors: the SQL binds on a shard but not over the partials
            raise InvalidQueryError(f"the shards' answers could not be combined: {exc}") from exc
        finally:
            connection.close()


def _partition_columns(route: Route) -> list[str]:
    return sorted({c for shard in route.shards for c in shard.values})


def _no_rows(request: QueryRequest, sql: str) -> QueryRequest:
    """`request` asking for `sql`'s columns and none of its rows (the closing parenthesis on a
    line of its own: a comment ending `sql` cannot swallow it)."""
    return dataclasses.replace(request, sql=f"SELECT * FROM ({sql}\n) AS speedlayer_probe LIMIT 0")


def _pruning_texts(parameters: str) -> dict[str, str]:
    """The bound values that may prune shards, by parameter number, as a literal's text: strings
    and integers (a partition value is held as text; other types are not compared as text)."""
    if not parameters:
        return {}
    return {number: str(value) for number, value in unpack_parameters(parameters).items()
            if isinstance(value, (str, int)) and not isinstance(value, bool)}


def _within(answer: pa.Table, route: Route, limits: QueryLimits) -> pa.Table:
    """`answer`, unless it exceeds the query's row or byte limit (ResultTooLargeError)."""
    if answer.num_rows > limits.max_rows or answer.nbytes > limits.max_bytes:
        raise ResultTooLargeError(
            f"result of the query on dataset {route.dataset!r} exceeds its limit (max_rows={limits.max_rows}, "
            f"max_bytes={limits.max_bytes}; {answer.num_rows} rows, {answer.nbytes} bytes)")
    return answer
