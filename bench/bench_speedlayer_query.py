"""Benchmark: queries through the speed layer's gateway vs the same queries in Spark on the same Delta table.

Usage: python bench/bench_speedlayer_query.py [--rows 2000000] [--appends 20] [--samples 200]

Writes a Delta table of the pipelines' `orders` shape (deltalake, `--appends` commits as a
pipeline's micro-batches would: _offset, order_id, customer, amount, currency, items,
_publish_time), starts a real etcd and an embedded speed layer (one master, two workers with
replication 2, one gateway; each a process), admits the table, then, in the same run:

* point lookup (`WHERE order_id = ...`, a random id each time) and a group-by aggregate
  through the gateway: p50/p99 over `--samples` (aggregate: a quarter of them), one client;
* queries/s of point lookups with 8 concurrent clients (threads, each its own connection);
* failed queries with 8 clients while one worker is killed -9 (the gateway retries the other);
* baseline: the same two queries in Spark (local[2], Delta) on the same table, uncached (a new
  read of the table each time) and cached (`cache()`d DataFrame, materialised first).

Goals: point p50 <= 20 ms and >= 100x Spark uncached; aggregate >= 10x Spark uncached; 0 failed
queries. Reports the load average, CPU seconds of the whole process tree (speed layer processes,
Spark's JVM) and wall seconds per phase. Writes bench/results/speedlayer_query.json.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "bench"))

from common import Column, Phase, closed_loop_load, machine_info, print_table, write_results  # noqa: E402
from pyspy_profile import print_summary, profile_processes  # noqa: E402

POINT_GOAL_MS, POINT_GOAL_RATIO, AGG_GOAL_RATIO = 20.0, 100.0, 10.0
POINT_SQL = "SELECT * FROM orders WHERE order_id = '{id}'"
AGG_SQL = ("SELECT currency, count(*) AS orders, sum(amount) AS amount, avg(items) AS items "
           "FROM orders GROUP BY currency ORDER BY currency")


def write_orders(path: str, rows: int, appends: int) -> None:
    import numpy as np
    import pyarrow as pa
    from deltalake import write_deltalake

    rng = np.random.default_rng(7)
    per = rows // appends
    currencies = pa.array(["EUR", "USD", "GBP"])
    for batch in range(appends):
        start = batch * per
        n = per if batch < appends - 1 else rows - start
        offsets = np.arange(start, start + n, dtype=np.int64)
        table = pa.table({
            "_offset": pa.array(offsets),
            "order_id": pa.array([f"o-{i:09d}" for i in offsets]),
            "customer": pa.array([f"c-{c:05d}" for c in rng.integers(0, 10_000, n)]),
            "amount": pa.array(np.round(rng.random(n) * 500, 2)),
            "currency": currencies.take(pa.array(rng.integers(0, 3, n))),
            "items": pa.array(rng.integers(1, 6, n, dtype=np.int32)),
            "_publish_time": pa.array((1_700_000_000_000_000 + offsets * 1000).astype("datetime64[us]")),
        })
        write_deltalake(path, table, mode="append")


def percentiles(samples_ms: list[float]) -> dict:
    ordered = sorted(samples_ms)
    return {"n": len(ordered), "p50_ms": round(statistics.median(ordered), 2),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 2),
            "mean_ms": round(statistics.fmean(ordered), 2)}


def timed_queries(run, sqls: list[str]) -> list[float]:
    out = []
    for sql in sqls:
        started = time.perf_counter()
        run(sql)
        out.append((time.perf_counter() - started) * 1000)
    return out


def concurrent_load(gateway: str, tenant: str, rows: int, clients: int, seconds: float,
                    during: Callable[[], object] | None = None) -> dict:
    """Point lookups of random ids by `clients` native clients (`closed_loop_load`)."""
    from speedlayer.clients import QueryClient

    @contextmanager
    def point_lookups(i: int) -> Iterator[Callable[[], object]]:
        rng = random.Random(i)
        with QueryClient(gateway, tenant, client_id=f"bench-{i}", timeout_ms=10_000) as client:
            yield lambda: client.query("orders", POINT_SQL.format(id=f"o-{rng.randrange(rows):09d}"))

    return closed_loop_load(point_lookups, clients, seconds, during).summary("queries", "qps")


def speed_layer_phase(path: str, rows: int, samples: int, seconds: float, phases: dict) -> dict:
    from danube_core.embedded_etcd import EmbeddedEtcd
    from speedlayer.clients import QueryClient
    from devstack.speedlayer_stack import EmbeddedSpeedLayer

    rng = random.Random(1)
    root = Path(tempfile.mkdtemp(prefix="bench-speedlayer-query-"))
    etcd = EmbeddedEtcd(str(root / "etcd"))
    layer = EmbeddedSpeedLayer(root / "speedlayer", etcd.endpoint, tenant="bench")
    try:
        with Phase("speedlayer_start_admit", phases):
            layer.start(workers=2, worker_memory_mb=2048, worker_threads=1)
            epoch = layer.admit("orders", path, replication=2)
            layer.wait_queryable("orders")
        with Phase("speedlayer_latency", phases), QueryClient(layer.gateway, "bench", client_id="bench") as client:
            def run(sql):
                return client.query("orders", sql)

            check = run(POINT_SQL.format(id="o-000000042"))
            assert check.num_rows == 1, check
            total = run("SELECT count(*) AS n FROM orders").column("n")[0].as_py()
            assert total == rows, (total, rows)
            run(AGG_SQL)  # warm
            point = timed_queries(run, [POINT_SQL.format(id=f"o-{rng.randrange(rows):09d}") for _ in range(samples)])
            agg = timed_queries(run, [AGG_SQL] * max(10, samples // 4))
            profile = profile_processes(
                [p.pid for p in layer.processes.values()],
                lambda: timed_queries(run, [POINT_SQL.format(id=f"o-{rng.randrange(rows):09d}") for _ in range(100)]
                                      + [AGG_SQL] * 25))
        with Phase("speedlayer_8_clients", phases):
            qps = concurrent_load(layer.gateway, "bench", rows, 8, seconds)
        with Phase("speedlayer_worker_kill", phases):
            kill = concurrent_load(layer.gateway, "bench", rows, 8, seconds, during=lambda: layer.kill("worker-w1"))
        return {"epoch": epoch, "point": percentiles(point), "aggregate": percentiles(agg), "qps_8_clients": qps,
                "worker_kill": kill,
                "profile": {"case": "100 point lookups and 25 aggregates through the gateway, untimed",
                            "processes": "gateway, master, workers (py-spy)", **profile}}
    finally:
        layer.stop()
        etcd.stop()
        shutil.rmtree(root, ignore_errors=True)


def spark_phase(path: str, rows: int, samples: int, phases: dict) -> dict:
    from pyspark.sql import SparkSession

    from pipelines.session import package_settings

    rng = random.Random(2)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[2]").appName("bench-speedlayer-query")
             .config("spark.driver.memory", "3g").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
             .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
             .config(map=package_settings()).getOrCreate())
    spark.sparkContext.setLogLevel("WARN")

    def run_uncached(sql):
        spark.read.format("delta").load(path).createOrReplaceTempView("orders")
        return spark.sql(sql).collect()

    try:
        assert len(run_uncached(POINT_SQL.format(id="o-000000042"))) == 1
        run_uncached(AGG_SQL)  # JIT and class loading out of the measurement
        n = max(5, samples // 20)
        with Phase("spark_uncached", phases):
            point_uncached = timed_queries(run_uncached, [POINT_SQL.format(id=f"o-{rng.randrange(rows):09d}")
                                                          for _ in range(n)])
            agg_uncached = timed_queries(run_uncached, [AGG_SQL] * n)
        cached = spark.read.format("delta").load(path).cache()
        assert cached.count() == rows
        cached.createOrReplaceTempView("orders")

        def run_cached(sql):
            return spark.sql(sql).collect()

        run_cached(AGG_SQL)
        with Phase("spark_cached", phases):
            point_cached = timed_queries(run_cached, [POINT_SQL.format(id=f"o-{rng.randrange(rows):09d}")
                                                      for _ in range(n * 2)])
            agg_cached = timed_queries(run_cached, [AGG_SQL] * (n * 2))
        return {"point_uncached": percentiles(point_uncached), "aggregate_uncached": percentiles(agg_uncached),
                "point_cached": percentiles(point_cached), "aggregate_cached": percentiles(agg_cached)}
    finally:
        spark.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--appends", type=int, default=20, help="Delta commits (the pipeline's micro-batches)")
    parser.add_argument("--samples", type=int, default=200, help="point queries timed through the gateway")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each 8-client load")
    args = parser.parse_args()
    load_before = round(os.getloadavg()[0], 2)
    phases: dict = {}
    root = Path(tempfile.mkdtemp(prefix="bench-speedlayer-table-"))
    path = str(root / "orders")
    try:
        with Phase("write_table", phases):
            write_orders(path, args.rows, args.appends)
        ours = speed_layer_phase(path, args.rows, args.samples, args.seconds, phases)
        spark = spark_phase(path, args.rows, args.samples, phases)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    point_ratio = spark["point_uncached"]["p50_ms"] / ours["point"]["p50_ms"]
    agg_ratio = spark["aggregate_uncached"]["p50_ms"] / ours["aggregate"]["p50_ms"]
    rows = [
        {"case": "point: gateway", **ours["point"]},
        {"case": "point: Spark uncached", **spark["point_uncached"]},
        {"case": "point: Spark cached", **spark["point_cached"]},
        {"case": "aggregate: gateway", **ours["aggregate"]},
        {"case": "aggregate: Spark uncached", **spark["aggregate_uncached"]},
        {"case": "aggregate: Spark cached", **spark["aggregate_cached"]},
    ]
    print_table(rows, [Column("case", "case"), Column("n", "n"), Column("p50 ms", "p50_ms", "{:.2f}"),
                       Column("p99 ms", "p99_ms", "{:.2f}")],
                title=f"{args.rows:,} rows in {args.appends} commits; point {point_ratio:.0f}x Spark uncached "
                      f"(goal >= {POINT_GOAL_RATIO:.0f}x, p50 <= {POINT_GOAL_MS:.0f} ms); aggregate {agg_ratio:.0f}x "
                      f"(goal >= {AGG_GOAL_RATIO:.0f}x)")
    print_table([{"case": "8 clients", **ours["qps_8_clients"]}, {"case": "8 clients, worker killed -9",
                                                                   **ours["worker_kill"]}],
                [Column("case", "case"), Column("queries", "queries"), Column("failed", "failed"),
                 Column("queries/s", "qps", "{:.0f}")])
    print_table([{"phase": k, **v} for k, v in phases.items()],
                [Column("phase", "phase"), Column("wall s", "wall_s", "{:.2f}"), Column("CPU s", "cpu_s", "{:.2f}"),
                 Column("load 1m", "load_1m", "{:.2f}")], title=f"load average before: {load_before}")
    print_summary("hot path, gateway and workers (own samples)", ours["profile"])
    write_results("speedlayer_query", {
        "machine": machine_info(), "load_before": load_before, "rows": args.rows, "appends": args.appends,
        "speedlayer": ours, "spark": spark, "phases": phases,
        "point_speedup_vs_spark_uncached": round(point_ratio, 1),
        "aggregate_speedup_vs_spark_uncached": round(agg_ratio, 1),
        "goals": {"point_p50_ms": POINT_GOAL_MS, "point_ratio": POINT_GOAL_RATIO, "aggregate_ratio": AGG_GOAL_RATIO,
                  "failed_queries": 0}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
