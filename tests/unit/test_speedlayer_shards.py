"""The pure parts of sharded epochs: shard planning, the epoch's state from its shards, the
gateway's query rewrite and merge (checked against DuckDB on the whole table), shard pruning,
and gathering the shards' rows for a shape that does not decompose (rewrite, decision, and the
gateway's scatter with each shard a DuckDB of its own)."""

from __future__ import annotations

import re
import time

import duckdb
import pyarrow as pa
import pytest

from speedlayer.api.v1 import control_plane_service_pb2 as cp
from speedlayer.errors import InvalidQueryError, PreconditionError, ResultTooLargeError
from speedlayer.gateway.gather_query import gather_refusal, plan_gather
from speedlayer.gateway.routing import ReplicaEndpoint, Route, ShardRoute, choose_epoch
from speedlayer.gateway.scatter import ShardScatter
from speedlayer.gateway.shard_query import PARTIALS, Unshardable, partition_pruning, plan_query, shards_to_ask
from speedlayer.master.lifecycle import served_epoch, superseded_keys
from speedlayer.master.quotas import usage
from speedlayer.master.sharded_epochs import cascaded, rolled_up, shard_note
from speedlayer.master.sharding import plan_shards, shard_limit, source_files, with_files
from speedlayer.protocol.query import QueryLimits, QueryRequest
from speedlayer.records import (
    ASSIGNED, EVICTED, FAILED, PLANNED, R_LOADING, R_READY, AssignmentRecord, ReplicaRecord,
)

pytestmark = pytest.mark.unit


def _file(name: str, size: int, **partition: str) -> cp.DataFile:
    return cp.DataFile(uri=name, size_bytes=size, record_count=size // 10, partition_values=partition)


# ---- shard planning ------------------------------------------------------------------------------

def test_an_epoch_that_fits_one_worker_is_not_sharded():
    files = [_file(f"f{i}", 100) for i in range(4)]
    assert plan_shards(files, [], estimated_bytes=800, limit=800, workers=4, where="e") == []
    assert plan_shards(files, [], estimated_bytes=800, limit=0, workers=4, where="e") == []  # no limit known
    assert plan_shards(files[:1], [], estimated_bytes=800, limit=100, workers=4, where="e") == []  # one file


def test_partitions_are_kept_whole_and_packed_into_the_fewest_shards():
    files = [_file(f"d{d}-{i}", 100, day=f"d{d}") for d in range(6) for i in range(2)]  # 6 days x 200 bytes
    shards = plan_shards(files, ["day"], estimated_bytes=2400, limit=900, workers=4, where="e")  # x2 in memory
    assert len(shards) == 3 and all(s.estimated_bytes == 800 for s in shards)
    assert sorted(v for s in shards for v in s.values["day"]) == [f"d{d}" for d in range(6)]
    assert all(len(s.values["day"]) == 2 for s in shards)  # a day never spans two shards
    assert sum(len(s.files) for s in shards) == 12


def test_a_partition_bigger_than_a_shard_is_split_by_files_and_its_value_is_in_each_part():
    files = [_file(f"big-{i}", 100, day="big") for i in range(4)] + [_file("small", 100, day="small")]
    shards = plan_shards(files, ["day"], estimated_bytes=500, limit=250, workers=4, where="e")
    assert max(s.estimated_bytes for s in shards) <= 250
    assert sum("big" in s.values["day"] for s in shards) >= 2


def test_unpartitioned_files_are_grouped_by_size():
    files = [_file("a", 400), _file("b", 300), _file("c", 200), _file("d", 100)]
    shards = plan_shards(files, [], estimated_bytes=1000, limit=500, workers=4, where="e")
    assert sorted(s.estimated_bytes for s in shards) == [500, 500] and all(s.values == {} for s in shards)


def test_more_shards_than_workers_is_refused_with_the_numbers():
    files = [_file(f"f{i}", 100, day=str(i)) for i in range(8)]
    with pytest.raises(PreconditionError, match=r"estimated at 800 bytes .*\(100 bytes per shard\): it needs 8 "
                                                r"shards but the tenant has 3 worker\(s\); start 5 more"):
        plan_shards(files, ["day"], estimated_bytes=800, limit=100, workers=3, where="epoch v1-x of t/d")


def test_the_shard_limit_is_the_tenants_or_a_share_of_its_smallest_worker():
    assert shard_limit(1234, [10_000]) == 1234
    assert shard_limit(0, [10_000, 5_000, 0]) == 4_000  # 0: a worker reporting no capacity
    assert shard_limit(0, []) == 0


def test_a_shards_plan_holds_only_its_files():
    source = cp.DataSource(delta=cp.DeltaSource(table_uri="/t", version=3, files=[_file("a", 1), _file("b", 2)]))
    narrowed = with_files(source, (source.delta.files[1],))
    assert [f.uri for f in source_files(narrowed)] == ["b"] and narrowed.delta.version == 3
    assert len(source.delta.files) == 2  # the epoch's source is left as it was


# ---- the epoch's state from its shards ---------------------------------------------------------

def _epoch(**fields) -> AssignmentRecord:
    values = {"tenant": "t", "dataset": "d", "epoch": "v1-x", "request_id": "r", "status": PLANNED,
              "version": 1, "estimated_memory_bytes": 1000, "replication": 2, "shards": ("v1-x.s0", "v1-x.s1")}
    return AssignmentRecord(**{**values, **fields})


def _shard(index: int, status: str = ASSIGNED, state: str = R_READY, **fields) -> AssignmentRecord:
    return AssignmentRecord(tenant="t", dataset="d", epoch=f"v1-x.s{index}", request_id="r", status=status,
                            version=1, estimated_memory_bytes=500, replication=2, kind="shard", shard_of="v1-x",
                            replicas={"w1": ReplicaRecord(state=state)} if state else {}, **fields)


def test_a_sharded_epoch_is_ready_only_when_every_shard_is():
    half = rolled_up(_epoch(), {"v1-x.s0": _shard(0), "v1-x.s1": _shard(1, state=R_LOADING)}, now_ms=5)
    assert (half.status, half.ready_shards, half.ready_ms) == (ASSIGNED, 1, 0)
    whole = rolled_up(half, {"v1-x.s0": _shard(0), "v1-x.s1": _shard(1)}, now_ms=9)
    assert (whole.ready_shards, whole.ready_ms) == (2, 9)
    assert served_epoch([half]) is None and served_epoch([whole]) == whole
    assert rolled_up(whole, {"v1-x.s0": _shard(0), "v1-x.s1": _shard(1)}, now_ms=12) is None  # unchanged
    unplaced = rolled_up(_epoch(), {"v1-x.s0": _shard(0), "v1-x.s1": _shard(1, status=PLANNED, state="")}, 5)
    assert unplaced.status == PLANNED


def test_one_failed_shard_fails_the_epoch_and_the_others_follow():
    failed = rolled_up(_epoch(status=ASSIGNED), {"v1-x.s0": _shard(0), "v1-x.s1": _shard(
        1, status=FAILED, state="", message="loading failed on 2 worker(s): w1: gone; w2: gone")}, now_ms=5)
    assert failed.status == FAILED and failed.message.startswith("1 of 2 shards failed to load")
    assert "shard v1-x.s1: loading failed on 2 worker(s): w1: gone; w2: gone" in failed.message
    follower = cascaded(_shard(0), failed)
    assert follower.status == FAILED and follower.replicas == {} and "v1-x" in follower.message
    assert cascaded(_shard(0), _epoch(status=EVICTED)).status == EVICTED
    assert cascaded(_shard(0), _epoch(status=ASSIGNED)) is None and cascaded(_shard(0), None) is None


def test_quotas_count_a_sharded_epoch_once_and_its_shards_go_with_it():
    epoch = _epoch(status=ASSIGNED)
    assert usage([epoch, _shard(0), _shard(1)]) == 2000  # 1000 x 2 replicas, not 3 records
    newer = _epoch(epoch="v2-y", version=2, status=ASSIGNED, shards=(), replicas={"w1": ReplicaRecord(state=R_READY)},
                   ready_ms=7)
    old = superseded_keys([epoch, _shard(0), _shard(1), newer])
    assert old == {("t", "d", "v1-x"), ("t", "d", "v1-x.s0"), ("t", "d", "v1-x.s1")}


def test_status_says_how_many_shards_are_ready_and_what_an_unplaced_one_lacks():
    records = [_epoch(status=PLANNED), _shard(0), _shard(1, status=PLANNED, state="")]
    note = shard_note(records[0], records, {"v1-x.s1": "capacity: a replica needs 500 bytes"})
    assert note == ("sharded into 2 shards (v1-x.s0, v1-x.s1): 1 of 2 READY; queryable when all are; "
                    "shard v1-x.s1: capacity: a replica needs 500 bytes")


def test_the_gateway_routes_a_sharded_epoch_only_when_every_shard_is_servable():
    epoch = _epoch(status=ASSIGNED, version=2, epoch="v2-x", shards=("v2-x.s0", "v2-x.s1"))
    older = _epoch(status=ASSIGNED, epoch="v1-o", shards=(), replicas={"w2": ReplicaRecord(state=R_READY)})
    shards = [AssignmentRecord(**{**_shard(i).__dict__, "epoch": f"v2-x.s{i}", "shard_of": "v2-x"}) for i in (0, 1)]
    addresses = {"w1": "h:1", "w2": "h:2"}
    assert choose_epoch([older, epoch, *shards], addresses) == (epoch, [])
    loading = AssignmentRecord(**{**shards[1].__dict__, "replicas": {"w1": ReplicaRecord(state=R_LOADING)}})
    assert choose_epoch([older, epoch, shards[0], loading], addresses) == (older, [ReplicaEndpoint("w2", "h:2")])


# ---- query rewrite and merge -------------------------------------------------------------------

@pytest.fixture(scope="module")
def table():
    connection = duckdb.connect()
    return connection.sql("SELECT range AS id, 'd' || (range % 5) AS day, (range % 13) * 1.5 AS amount, "
                          "CASE WHEN range % 7 = 0 THEN NULL ELSE range % 4 END AS k FROM range(300)").to_arrow_table()


def _sharded(table: pa.Table, sql: str, shards: int = 3) -> tuple[list[dict], list[dict]]:
    """(answer through shards and merge, answer on the whole table)."""
    query = plan_query(sql, "orders", ["day"])
    whole = duckdb.connect()
    whole.register("orders", table)
    partials = []
    for index in range(shards):  # rows split by id, so that every shard holds every day
        connection = duckdb.connect()
        connection.register("orders", whole.sql(f"SELECT * FROM orders WHERE id % {shards} = {index}").to_arrow_table())
        partials.append(connection.sql(query.shard_sql).to_arrow_table())
    merge = duckdb.connect()
    merge.register(PARTIALS, pa.concat_tables(partials))
    got, want = merge.sql(query.merge_sql).to_arrow_table(), whole.sql(sql).to_arrow_table()
    assert got.column_names == want.column_names
    return got.to_pylist(), want.to_pylist()


@pytest.mark.parametrize("sql", [
    "SELECT day, count(*), count(k), sum(amount) AS s, min(id), max(id), avg(amount) FROM orders GROUP BY day ORDER BY day",
    "SELECT count(*) AS n, avg(amount) + 1 AS a FROM orders WHERE amount > 3",
    "SELECT day, k, count(*) AS n FROM orders GROUP BY day, k HAVING count(*) > 5 ORDER BY n DESC, day, k LIMIT 4",
    "SELECT day AS d, sum(amount) FILTER (WHERE k = 1) AS f FROM orders GROUP BY 1 ORDER BY 1",
    "SELECT amount > 9 AS high, max(day) FROM orders GROUP BY amount > 9 ORDER BY high",
    "SELECT id, amount FROM orders ORDER BY amount DESC, id LIMIT 6 OFFSET 2",
    "SELECT id FROM orders WHERE day = 'd3' ORDER BY amount * -1, id LIMIT 5",
    "SELECT id * 2 AS twice FROM orders ORDER BY twice DESC LIMIT 3",
    "SELECT sum(amount) FROM orders WHERE id < 0",  # no row anywhere: NULL, as on the whole table
    "SELECT avg(k) AS mean FROM orders WHERE k IS NULL",
])
def test_decomposable_shapes_merge_to_the_whole_tables_answer(table, sql):
    got, want = _sharded(table, sql)
    assert got == want


@pytest.mark.parametrize("sql, construct", [
    ("SELECT count(DISTINCT day) FROM orders", "count(DISTINCT ...)"),
    ("SELECT median(amount) FROM orders", "aggregate median()"),
    ("SELECT quantile_cont(amount, 0.9) FROM orders", "aggregate quantile_cont()"),
    ("SELECT string_agg(day, ',' ORDER BY id) FROM orders", "aggregate string_agg()"),
    ("SELECT id, rank() OVER (ORDER BY amount) FROM orders", "window function rank() OVER (...)"),
    ("SELECT * FROM orders a JOIN orders b USING (id)", "a join"),
    ("SELECT * FROM orders WHERE id IN (SELECT 1)", "a subquery"),
    ("WITH x AS (SELECT * FROM orders) SELECT * FROM x", "WITH (a common table expression)"),
    ("SELECT id FROM orders UNION SELECT id FROM orders", "UNION/INTERSECT/EXCEPT"),
    ("SELECT DISTINCT day FROM orders", "SELECT DISTINCT"),
    ("SELECT day, count(*) FROM orders GROUP BY CUBE (day)", "GROUPING SETS / ROLLUP / CUBE"),
    ("SELECT day, count(*) FROM orders GROUP BY ALL", "GROUP BY ALL"),
    ("SELECT * FROM other", "reading base table instead of the dataset orders"),
])
def test_shapes_that_do_not_decompose_are_refused_naming_the_construct(sql, construct):
    with pytest.raises(Unshardable) as refused:
        plan_query(sql, "orders", ["day"])
    assert refused.value.construct == construct


# ---- pruning -----------------------------------------------------------------------------------

SHARD_VALUES = [{"day": ["d0", "d1"]}, {"day": ["d2"]}, {"day": ["d3", "d4"]}]


@pytest.mark.parametrize("where, asked", [
    ("day = 'd2'", [1]),
    ("'d3' = day AND amount > 1", [2]),
    ("day IN ('d0', 'd4')", [0, 2]),
    ("day IN ('d0', 'd4') AND day = 'd4'", [2]),
    ("amount > 1", [0, 1, 2]),                  # not a partition column: every shard
    ("id = 3", [0, 1, 2]),
    ("day = 'd2' OR id = 3", [0, 1, 2]),        # a disjunction prunes nothing
    ("day = '2024-01-01 00:00:00'", [0, 1, 2]),  # a spelling no shard holds: no pruning on it
    ("day = 'd1' AND day = 'd2'", [0]),         # nothing can match: one shard answers (the shape)
])
def test_shards_are_pruned_by_partition_equalities_in_the_where_clause(where, asked):
    pruning = plan_query(f"SELECT count(*) FROM orders WHERE {where}", "orders", ["day"]).pruning
    assert shards_to_ask(SHARD_VALUES, pruning) == asked


def test_any_shape_on_one_partition_is_pruned_but_not_one_that_reads_other_rows():
    assert shards_to_ask(SHARD_VALUES, partition_pruning(
        "SELECT count(DISTINCT id), median(amount) FROM orders WHERE day = 'd2'", ["day"])) == [1]
    for sql in ("SELECT * FROM orders WHERE day = 'd2' AND id IN (SELECT id FROM orders)",
                "WITH o AS (SELECT * FROM orders) SELECT * FROM o WHERE day = 'd2'",
                "SELECT * FROM orders a JOIN orders b USING (id) WHERE a.day = 'd2'"):
        assert shards_to_ask(SHARD_VALUES, partition_pruning(sql, ["day"])) == [0, 1, 2], sql


# ---- gathering a shape that does not decompose -----------------------------------------------

def _gathered(table: pa.Table, sql: str, shards: int = 3):
    """(plan, answer run at the 'gateway' on the shards' fetched rows, answer on the whole table)."""
    plan = plan_gather(sql, "orders", table.column_names)
    whole = duckdb.connect()
    whole.register("orders", table)
    fetched = []
    for index in range(shards):
        connection = duckdb.connect()
        connection.register("orders", whole.sql(f"SELECT * FROM orders WHERE id % {shards} = {index}").to_arrow_table())
        fetched.append(connection.sql(plan.fetch_sql).to_arrow_table())
    gateway = duckdb.connect()
    gateway.register("orders", pa.concat_tables(fetched))
    return plan, gateway.sql(plan.local_sql).to_arrow_table(), whole.sql(sql).to_arrow_table()


@pytest.mark.parametrize("sql, columns, filtered", [
    ("SELECT count(DISTINCT day) AS d, median(amount) AS m FROM orders WHERE amount > 3", ("day", "amount"), True),
    ("SELECT id, sum(amount) OVER (PARTITION BY day ORDER BY id) AS run FROM orders WHERE k = 1 ORDER BY id",
     ("id", "day", "amount"), True),                                                # k: only in the pushed WHERE
    ("SELECT a.day, count(*) AS n FROM orders a JOIN orders b USING (id) WHERE b.k = 2 GROUP BY a.day ORDER BY 1",
     ("id", "day", "k"), False),                                                    # a join: every row fetched
    ("WITH t AS (SELECT day, amount FROM orders WHERE k IS NULL) "
     "SELECT day, quantile_cont(amount, 0.5) AS q FROM t GROUP BY day ORDER BY day", ("day", "amount", "k"), False),
    ("SELECT amount * 2 AS a FROM orders WHERE a > 10 ORDER BY a LIMIT 3", ("amount",), False),  # a select alias
    ("SELECT median(amount) AS amount FROM orders WHERE amount > 10", ("amount",), True),  # the column, not the alias
    ("SELECT count(DISTINCT 1) AS one, count(*) AS n FROM orders WHERE random() < 2", (), True),    # names no column
    ("SELECT o FROM orders o WHERE o.id < 3 ORDER BY o.id", ("id", "day", "amount", "k"), True),    # the row itself
    ("SELECT x.* FROM orders AS x(a, b) WHERE a < 4 ORDER BY a", ("id", "day", "amount", "k"), False),  # renamed
    ("SELECT id FROM orders WHERE day = 'd1' UNION SELECT id + 1000 FROM orders ORDER BY 1 LIMIT 4",
     ("id", "day"), False),
    ("SELECT DISTINCT day FROM orders WHERE amount < 5 ORDER BY day", ("day",), True),
])
def test_a_gathered_query_reads_only_the_columns_and_rows_it_needs_and_answers_as_on_the_whole_table(
        table, sql, columns, filtered):
    plan, got, want = _gathered(table, sql)
    assert (plan.columns, plan.filtered) == (columns, filtered)
    assert got.column_names == want.column_names and got.to_pylist() == want.to_pylist()
    if filtered:  # the WHERE runs on the shards, once
        assert "WHERE" in plan.fetch_sql and "WHERE" not in plan.local_sql


@pytest.mark.parametrize("sql, read", [
    ("SELECT count(DISTINCT id) FROM orders JOIN other USING (id)", "it reads 'other'"),
    ("SELECT median(id) FROM main.orders", "it reads 'main.orders'"),
    ("SELECT * FROM read_csv('/etc/passwd')", "table function read_csv() is not allowed"),
    ("SELECT (SELECT count(*) FROM glob('/*')) AS n FROM orders", "table function glob() is not allowed"),
])
def test_a_gathered_query_may_read_nothing_but_its_dataset(sql, read):
    with pytest.raises(InvalidQueryError, match=re.escape(read)):
        plan_gather(sql, "orders", ["id"])


def test_a_query_is_gathered_only_when_its_shards_fit_the_limit_and_otherwise_says_both_numbers():
    assert gather_refusal("aggregate median()", "orders", "v0-x", 4, 2, 1000, 1000) is None
    refused = gather_refusal("aggregate median()", "orders", "v0-x", 4, 3, 1001, 1000)
    assert refused.startswith("aggregate median() cannot be answered on dataset 'orders': its epoch v0-x is split "
                              "into 4 shards")
    assert "needs 1001 bytes (3 shard(s)' estimated memory), the gather limit is 1000 bytes" in refused
    assert "is off for this tenant (gather_max_bytes 0)" in gather_refusal("a join", "orders", "v0-x", 4, 1, 5, 0)


def _scatter_route(shard_tables: list[pa.Table], estimated: int) -> Route:
    shards = tuple(ShardRoute(f"v0-x.s{i}", {"day": sorted(set(t.column("day").to_pylist()))},
                              (ReplicaEndpoint(f"w{i}", f"h:{i}"),), estimated) for i, t in enumerate(shard_tables))
    return Route("t", "orders", "v0-x", 0, (), shards)


def test_the_gateway_gathers_the_shards_a_query_needs_and_notes_it_in_the_answer(table):
    """ShardScatter end to end with each shard a DuckDB of its own rows (what forwarding reaches)."""
    days = {f"d{d}": [0] if d < 2 else [1] if d < 4 else [2] for d in range(5)}  # d0 d1 | d2 d3 | d4
    whole = duckdb.connect()
    whole.register("orders", table)
    parts = [whole.sql(f"SELECT * FROM orders WHERE day IN ({', '.join(repr(d) for d, s in days.items() if s == [i])})")
             .to_arrow_table() for i in range(3)]
    calls: list[tuple[str, str, int]] = []

    def forward(route: Route, request: QueryRequest, limits: QueryLimits, deadline: float):
        calls.append((route.epoch, request.sql, limits.max_bytes))
        connection = duckdb.connect()
        connection.register("orders", parts[int(route.epoch[-1])])
        answer = connection.sql(request.sql).to_arrow_table()
        return answer.schema, answer.to_batches()

    scatter = ShardScatter(forward, lambda tenant: 5000)
    try:
        limits, deadline = QueryLimits(), time.monotonic() + 30
        sql = "SELECT count(DISTINCT k) AS ks, median(amount) AS m FROM orders WHERE day IN ('d1', 'd2', 'd3')"
        answer = scatter.run(_scatter_route(parts, 2500), QueryRequest("orders", sql), limits, deadline)
        assert answer.to_pylist() == whole.sql(sql).to_arrow_table().to_pylist()
        assert answer.schema.metadata[b"speedlayer.note"].startswith(b"gathered 2 of 3 shards of epoch v0-x (")
        assert calls[0][:2] == ("v0-x.s0", 'SELECT * FROM "orders" LIMIT 0')  # the dataset's columns, once
        assert sorted(c[0] for c in calls[1:]) == ["v0-x.s0", "v0-x.s1"]  # then the rows of the shards asked
        assert all(c[2] == 5000 for c in calls[1:])  # each fetch is held to the gather limit
        calls.clear()
        with pytest.raises(InvalidQueryError, match=r"^aggregate median\(\) cannot be answered .* needs 7500 bytes "
                                                    r"\(3 shard\(s\)' estimated memory\), the gather limit is 5000"):
            scatter.run(_scatter_route(parts, 2500), QueryRequest("orders", "SELECT median(id) FROM orders"),
                        limits, deadline)
        assert calls == []  # refused before anything was fetched
        with pytest.raises(ResultTooLargeError, match=r"read \d+ bytes, more than the gather limit of 5000 bytes"):
            scatter.run(_scatter_route(parts, 10), QueryRequest(
                "orders", "SELECT median(id), string_agg(day, ','), max(amount) FROM orders"), limits, deadline)
    finally:
        scatter.close()


@pytest.mark.parametrize("sql, refused", [
    ("SELECT day, count(*) AS n, sum(amount) AS s, avg(k) AS mean FROM orders GROUP BY day ORDER BY day", False),
    ("SELECT id, amount FROM orders ORDER BY amount DESC, id LIMIT 6 OFFSET 2", False),  # top-N, a hidden key
    ("SELECT id, k FROM orders WHERE day = 'd4' ORDER BY id", False),  # one shard, as it is
    ("SELECT count(DISTINCT k) AS ks, median(amount) AS m FROM orders WHERE day IN ('d1', 'd2', 'd3')", False),
    ("SELECT median(id) AS m, string_agg(day, ',') AS days FROM orders", True),  # too big to gather
])
def test_a_sharded_statements_schema_is_learned_from_its_plan_without_rows_and_never_refused(table, sql, refused):
    """Issue 41: Flight SQL clients prepare a statement before running it; its schema comes from
    the plan `run` follows, each shard asked for no rows, and nothing is gathered or refused for
    its size (the schema probe used to wrap the statement in a subquery, a shape the merge refuses)."""
    days = {f"d{d}": 0 if d < 2 else 1 if d < 4 else 2 for d in range(5)}  # d0 d1 | d2 d3 | d4
    whole = duckdb.connect()
    whole.register("orders", table)
    parts = [whole.sql(f"SELECT * FROM orders WHERE day IN ({', '.join(repr(d) for d, s in days.items() if s == i)})")
             .to_arrow_table() for i in range(3)]
    rows_sent: list[int] = []

    def forward(route: Route, request: QueryRequest, limits: QueryLimits, deadline: float):
        connection = duckdb.connect()
        connection.register("orders", parts[int(route.epoch[-1])])
        answer = connection.sql(request.sql).to_arrow_table()
        rows_sent.append(answer.num_rows)
        return answer.schema, answer.to_batches()

    scatter = ShardScatter(forward, lambda tenant: 5000)
    try:
        limits, deadline = QueryLimits(), time.monotonic() + 30
        schema = scatter.schema(_scatter_route(parts, 2500), QueryRequest("orders", sql), limits, deadline)
        assert rows_sent and set(rows_sent) == {0}  # one shard's columns, never its rows
        assert schema.names == whole.sql(sql).to_arrow_table().schema.names
        if refused:  # running it is refused, as before
            with pytest.raises(InvalidQueryError, match="cannot be answered .* the gather limit is 5000"):
                scatter.run(_scatter_route(parts, 2500), QueryRequest("orders", sql), limits, deadline)
        else:
            answer = scatter.run(_scatter_route(parts, 2500), QueryRequest("orders", sql), limits, deadline)
            assert schema.types == answer.schema.types
    finally:
        scatter.close()
