"""Result aggregation at the gateway: a query on a sharded epoch, scattered and merged.

The shards that cannot hold rows the WHERE clause admits are pruned first. When one shard is
left it holds every row the query can see, so the query runs there as it is (any shape) and its
answer is the answer. Otherwise the query is planned (`shard_query.plan_query`: refused there if
its shape cannot be combined) and one replica of each remaining shard is asked in parallel through the gateway's own forwarding (`forward`: the
shard's replicas in the client's order, retried on the next as for any epoch). Every shard of
one query is of the same epoch: the route pinned it. The partial answers are concatenated and
the merge runs on the gateway's DuckDB (one in-memory database, a connection per query); the
result is held to the query's row and byte limits like a worker's answer.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable

import pyarrow as pa

from speedlayer.errors import InvalidQueryError, QueryTimeoutError, ResultTooLargeError
from speedlayer.gateway.routing import Route
from speedlayer.gateway.shard_query import PARTIALS, Unshardable, partition_pruning, plan_query, shards_to_ask
from speedlayer.observability.metrics import GATEWAY_SHARDS
from speedlayer.protocol.query import QueryLimits, QueryRequest

logger = logging.getLogger(__name__)

Forward = Callable[[Route, QueryRequest, QueryLimits, float], tuple[pa.Schema, Iterable[pa.RecordBatch]]]
MAX_PARALLEL_SHARDS = 16  # shard calls in flight at once, over all queries of a gateway


class ShardScatter:
    """`run(route, request, limits, deadline)`: the merged answer of a sharded route's shards."""

    def __init__(self, forward: Forward) -> None:
        self._forward = forward
        self._pool = ThreadPoolExecutor(MAX_PARALLEL_SHARDS, thread_name_prefix="shard-call")
        self._merger: Any = None
        self._lock = threading.Lock()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def run(self, route: Route, request: QueryRequest, limits: QueryLimits, deadline: float) -> pa.Table:
        columns = sorted({c for shard in route.shards for c in shard.values})
        asked = [route.shards[i] for i in shards_to_ask([s.values for s in route.shards],
                                                         partition_pruning(request.sql, columns))]
        GATEWAY_SHARDS.labels(tenant=route.tenant, outcome="asked").inc(len(asked))
        GATEWAY_SHARDS.labels(tenant=route.tenant, outcome="pruned").inc(len(route.shards) - len(asked))
        if len(asked) == 1:
            return self._answer(route.one_shard(asked[0]), request, limits, deadline)
        try:
            query = plan_query(request.sql, route.dataset, columns)
        except Unshardable as exc:
            raise InvalidQueryError(
                f"{exc.construct} cannot be answered on dataset {route.dataset!r}: its epoch {route.epoch} is split "
                f"into {len(route.shards)} shards and the gateway combines only count, sum, min, max, avg (with or "
                "without GROUP BY), ORDER BY ... LIMIT and plain projections") from exc
        shard_request = dataclasses.replace(request, sql=query.shard_sql)
        calls = [self._pool.submit(self._answer, route.one_shard(shard), shard_request, limits, deadline)
                 for shard in asked]
        partials = [call.result(timeout=max(0.001, deadline - time.monotonic()) + 1.0) for call in calls]
        merged = self._merge(query.merge_sql, pa.concat_tables(partials, promote_options="default"))
        if merged.num_rows > limits.max_rows or merged.nbytes > limits.max_bytes:
            raise ResultTooLargeError(
                f"result of the query on dataset {route.dataset!r} exceeds its limit (max_rows={limits.max_rows}, "
                f"max_bytes={limits.max_bytes}; {merged.num_rows} rows, {merged.nbytes} bytes)")
        return merged

    def _answer(self, route: Route, request: QueryRequest, limits: QueryLimits, deadline: float) -> pa.Table:
        if deadline <= time.monotonic():
            raise QueryTimeoutError(f"query on dataset {route.dataset!r} exceeded its deadline of "
                                    f"{limits.timeout_ms} ms before shard {route.epoch} was asked")
        schema, batches = self._forward(route, request, limits, deadline)
        return pa.Table.from_batches(list(batches), schema)

    def _merge(self, sql: str, partials: pa.Table) -> pa.Table:
        with self._lock:
            if self._merger is None:
                import duckdb

                self._merger = duckdb.connect(":memory:")
            connection = self._merger.cursor()
        try:
            connection.register(PARTIALS, partials)
            return connection.sql(sql).to_arrow_table()
        except Exception as exc:  # DuckDB's errors: the SQL binds on a shard but not over the partials
            raise InvalidQueryError(f"the shards' answers could not be combined: {exc}") from exc
        finally:
            connection.close()
