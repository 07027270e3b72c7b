"""Benchmark: a ~1 GB Delta snapshot into worker memory vs Spark's `cache().count()` of the same table.

Usage: python bench/bench_speedlayer_load.py [--rows 20000000] [--threads 2]

Writes a partitioned Delta table (deltalake, 30 day partitions, 7 columns; ~48 bytes a row in
Arrow, so 20 M rows is ~1 GB in memory), then, in the same run:
* speed layer: what a worker does for an assignment: the master's resolve of the Delta log into
  a LoadPlan (`DeltaTableSource`), then `EpochLoader.load` into DuckDB (`--threads`, memory limit
  8 GB), partition columns added;
* baseline: `spark.read.format("delta").load(path).cache().count()` on a local[`--threads`]
  session with Delta (session start not timed; driver memory 6 GB).
Both count the same rows. Goal: the speed layer >= 10x faster. A second, untimed load runs
under cProfile (the resolve and load path's Python side; DuckDB's own threads show as its
calls). Reports the load average and CPU seconds. Writes bench/results/speedlayer_load.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "bench"))

from common import Column, machine_info, print_table, profile_top, tree_cpu_s, write_results  # noqa: E402

GOAL_RATIO = 10.0


def write_table(path: str, rows: int) -> int:
    import numpy as np
    import pyarrow as pa
    from deltalake import write_deltalake

    rng = np.random.default_rng(7)
    chunk = 2_000_000
    for start in range(0, rows, chunk):
        n = min(chunk, rows - start)
        categories = pa.array([f"cat-{i:04d}" for i in range(1000)])
        table = pa.table({
            "id": pa.array(np.arange(start, start + n, dtype=np.int64)),
            "customer": pa.array(rng.integers(0, 1_000_000, n, dtype=np.int64)),
            "amount": pa.array(rng.random(n) * 1000),
            "price": pa.array(rng.random(n) * 100),
            "qty": pa.array(rng.integers(1, 50, n, dtype=np.int32)),
            "category": categories.take(pa.array(rng.integers(0, 1000, n))),
            "day": pa.array([f"2024-01-{d:02d}" for d in (np.arange(start, start + n) % 30 + 1)]),
        })
        write_deltalake(path, table, partition_by=["day"], mode="append")
    return rows


def speed_layer_load(path: str, threads: int) -> dict:
    from speedlayer.api.v1 import control_plane_service_pb2 as cp
    from speedlayer.api.v1 import management_service_pb2 as mg
    from speedlayer.sources.delta import DeltaTableSource
    from speedlayer.worker.loader import EpochLoader

    cpu0, started = tree_cpu_s(), time.perf_counter()
    resolved = DeltaTableSource().resolve(mg.DataSourceIdentifier(delta_table=mg.DeltaTable(table_uri=path)), [])
    resolved_s = time.perf_counter() - started
    plan = cp.LoadPlan(plan_id="bench", source=resolved.source, destination_table_name="bench_v0",
                       arrow_schema=resolved.arrow_schema, partition_columns=resolved.partition_columns)
    loader = EpochLoader(memory_limit_bytes=8 * 1024**3, threads=threads)
    result = loader.load(plan)
    total_s = time.perf_counter() - started
    return {"rows": result.rows, "files": resolved.file_count, "parquet_bytes": resolved.total_bytes,
            "memory_bytes": result.memory_bytes, "resolve_s": round(resolved_s, 3),
            "load_s": round(result.seconds, 3), "total_s": round(total_s, 3),
            "cpu_s": round(tree_cpu_s() - cpu0, 2)}


def spark_cache_count(path: str, threads: int) -> dict:
    from pyspark.sql import SparkSession

    from pipelines.session import package_settings

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(f"local[{threads}]").appName("bench-speedlayer-load")
             .config("spark.driver.memory", "6g")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", str(threads))
             .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
             .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
             .config(map=package_settings())
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    try:
        cpu0, started = tree_cpu_s(), time.perf_counter()
        rows = spark.read.format("delta").load(path).cache().count()
        seconds = time.perf_counter() - started
        return {"rows": rows, "seconds": round(seconds, 3), "cpu_s_process_tree": round(tree_cpu_s() - cpu0, 2)}
    finally:
        spark.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the generated table")
    args = parser.parse_args()
    load_start = round(os.getloadavg()[0], 2)
    root = Path(tempfile.mkdtemp(prefix="bench-speedlayer-load-"))
    path = str(root / "orders")
    try:
        started = time.perf_counter()
        write_table(path, args.rows)
        write_s = time.perf_counter() - started
        ours = speed_layer_load(path, args.threads)
        profile = profile_top(lambda: speed_layer_load(path, args.threads), top=12)
        spark = spark_cache_count(path, args.threads)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    assert ours["rows"] == spark["rows"] == args.rows, (ours, spark)
    ratio = spark["seconds"] / ours["total_s"]
    print_table([
        {"case": "speed layer: resolve + DuckDB load", "seconds": ours["total_s"], "cpu_s": ours["cpu_s"],
         "rows": ours["rows"]},
        {"case": "baseline: Spark cache().count()", "seconds": spark["seconds"], "cpu_s": spark["cpu_s_process_tree"],
         "rows": spark["rows"]},
    ], [Column("case", "case"), Column("seconds", "seconds", "{:.2f}"), Column("CPU s", "cpu_s", "{:.2f}"),
        Column("rows", "rows", "{:,}")],
        title=f"{ours['parquet_bytes'] / 1e6:.0f} MB Parquet in {ours['files']} files; "
              f"{ours['memory_bytes'] / 1e6:.0f} MB in DuckDB; speedup {ratio:.1f}x (goal >= {GOAL_RATIO:.0f}x); "
              f"load at start {load_start}")
    print("speed layer load hot path (own time, cProfile):")
    for row in profile[:6]:
        print(f"  {row['share']:>6.1%}  {row['function']}")
    write_results("speedlayer_load", {"machine": machine_info(), "load_average_1m_start": load_start,
                                      "rows": args.rows, "threads": args.threads,
                                      "profile": {"case": "a second load, untimed", "tool": "cProfile",
                                                  "top_own_time": profile},
                                      "write_table_s": round(write_s, 1), "speedlayer": ours, "spark": spark,
                                      "speedup": round(ratio, 2), "goal_speedup": GOAL_RATIO})
    return 0


if __name__ == "__main__":
    sys.exit(main())
