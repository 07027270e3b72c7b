"""Benchmark: the gateway's Arrow Flight SQL (the ADBC driver) vs its native client, same gateway, same run.

Usage: python bench/bench_flight_sql.py [--rows 2000000] [--appends 20] [--samples 200] [--seconds 10]

Writes the `orders` Delta table of bench_speedlayer_query.py, starts a real etcd and an
embedded speed layer (one master, two workers with replication 2, one gateway; each a
process), admits the table, then measures, alternating the clients sample by sample so both
see the same machine:

* point lookup by `order_id` (a random id each time): `speedlayer.clients.QueryClient` (one
  DoGet), ADBC with a `?` parameter (a prepared statement: DoPut of the parameter, then
  GetFlightInfo and DoGet) and ADBC with the id written into the SQL (GetFlightInfo, DoGet);
* a group-by over all rows: `QueryClient` and ADBC;
* failed statements with 4 ADBC clients while one worker is killed -9 (the gateway retries the
  other replica at GetFlightInfo).

Goals (issue 27): ADBC point p50 within 1.5x of the native client's, group-by within 1.2x, 0
failed statements. Writes bench/results/flight_sql.json.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "bench"))

from bench_speedlayer_query import AGG_SQL, POINT_SQL, Phase, percentiles, write_orders  # noqa: E402
from common import Column, machine_info, print_table, write_results  # noqa: E402

POINT_GOAL_RATIO, AGG_GOAL_RATIO = 1.5, 1.2
POINT_PREPARED_SQL = "SELECT * FROM orders WHERE order_id = ?"
TENANT = "bench"


def _timed(run) -> float:
    started = time.perf_counter()
    run()
    return (time.perf_counter() - started) * 1000


def adbc_connection(gateway: str):
    import adbc_driver_flightsql.dbapi as flight_sql

    # A tenant without a token: any password is accepted, as the native path accepts the header alone.
    return flight_sql.connect(f"grpc://{gateway}", db_kwargs={"username": TENANT, "password": ""}, autocommit=True)


def latency_phase(gateway: str, rows: int, samples: int) -> dict:
    from speedlayer.clients import QueryClient

    rng = random.Random(1)
    ids = [f"o-{rng.randrange(rows):09d}" for _ in range(samples)]
    aggregates = max(10, samples // 4)
    out: dict[str, list[float]] = {k: [] for k in ("point_native", "point_adbc_prepared", "point_adbc_literal",
                                                    "aggregate_native", "aggregate_adbc")}
    with QueryClient(gateway, TENANT, client_id="bench") as native, adbc_connection(gateway) as conn, \
            conn.cursor() as prepared, conn.cursor() as literal:
        def adbc(cursor, sql, parameters=None):
            cursor.execute(sql, parameters=parameters)
            return cursor.fetch_arrow_table()

        expected = native.query("orders", POINT_SQL.format(id=ids[0]))
        assert adbc(prepared, POINT_PREPARED_SQL, (ids[0],)).equals(expected), "ADBC and native answers differ"
        assert adbc(literal, AGG_SQL).equals(native.query("orders", AGG_SQL)), "ADBC and native answers differ"
        for order_id in ids:  # interleaved: the same load for each client
            sql = POINT_SQL.format(id=order_id)
            out["point_native"].append(_timed(lambda s=sql: native.query("orders", s)))
            out["point_adbc_prepared"].append(_timed(lambda i=order_id: adbc(prepared, POINT_PREPARED_SQL, (i,))))
            out["point_adbc_literal"].append(_timed(lambda s=sql: adbc(literal, s)))
        for _ in range(aggregates):
            out["aggregate_native"].append(_timed(lambda: native.query("orders", AGG_SQL)))
            out["aggregate_adbc"].append(_timed(lambda: adbc(literal, AGG_SQL)))
    return {name: percentiles(samples_ms) for name, samples_ms in out.items()}


def adbc_worker_kill(gateway: str, rows: int, clients: int, seconds: float, kill) -> dict:
    ok, failures, lock, stop = [0], [], threading.Lock(), threading.Event()

    def client_loop(i: int) -> None:
        rng = random.Random(i)
        with adbc_connection(gateway) as conn, conn.cursor() as cursor:
            while not stop.is_set():
                try:
                    cursor.execute(POINT_PREPARED_SQL, parameters=(f"o-{rng.randrange(rows):09d}",))
                    assert cursor.fetch_arrow_table().num_rows == 1
                    with lock:
                        ok[0] += 1
                except Exception as exc:  # noqa: BLE001 - counted and reported
                    with lock:
                        failures.append(f"{type(exc).__name__}: {str(exc)[:160]}")

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    time.sleep(seconds / 2)
    kill()
    time.sleep(seconds / 2)
    stop.set()
    for thread in threads:
        thread.join(30)
    wall = time.perf_counter() - started
    return {"clients": clients, "seconds": round(wall, 2), "statements": ok[0], "failed": len(failures),
            "per_s": round(ok[0] / wall, 1), "failures_sample": failures[:3]}


def main() -> int:
    from devstack.embedded_etcd import EmbeddedEtcd
    from devstack.speedlayer_stack import EmbeddedSpeedLayer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--appends", type=int, default=20, help="Delta commits (the pipeline's micro-batches)")
    parser.add_argument("--samples", type=int, default=200, help="point lookups timed per client")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the worker-kill load")
    args = parser.parse_args()
    load_before = round(os.getloadavg()[0], 2)
    phases: dict = {}
    root = Path(tempfile.mkdtemp(prefix="bench-flight-sql-"))
    etcd = layer = None
    try:
        with Phase("write_table", phases):
            write_orders(str(root / "orders"), args.rows, args.appends)
        etcd = EmbeddedEtcd(str(root / "etcd"))
        layer = EmbeddedSpeedLayer(root / "speedlayer", etcd.endpoint, tenant=TENANT)
        with Phase("start_admit", phases):
            layer.start(workers=2, worker_memory_mb=2048, worker_threads=1)
            epoch = layer.admit("orders", str(root / "orders"), replication=2)
            layer.wait_queryable("orders")
        with Phase("latency", phases):
            latency = latency_phase(layer.gateway, args.rows, args.samples)
        with Phase("adbc_worker_kill", phases):
            kill = adbc_worker_kill(layer.gateway, args.rows, 4, args.seconds, lambda: layer.kill("worker-w1"))
    finally:
        if layer is not None:
            layer.stop()
        if etcd is not None:
            etcd.stop()
        shutil.rmtree(root, ignore_errors=True)
    point_ratio = latency["point_adbc_prepared"]["p50_ms"] / latency["point_native"]["p50_ms"]
    literal_ratio = latency["point_adbc_literal"]["p50_ms"] / latency["point_native"]["p50_ms"]
    agg_ratio = latency["aggregate_adbc"]["p50_ms"] / latency["aggregate_native"]["p50_ms"]
    names = {"point_native": "point: speedlayer.clients", "point_adbc_prepared": "point: ADBC, ? parameter",
             "point_adbc_literal": "point: ADBC, literal SQL", "aggregate_native": "group-by: speedlayer.clients",
             "aggregate_adbc": "group-by: ADBC"}
    print_table([{"case": names[k], **v} for k, v in latency.items()],
                [Column("case", "case"), Column("n", "n"), Column("p50 ms", "p50_ms", "{:.2f}"),
                 Column("p99 ms", "p99_ms", "{:.2f}"), Column("mean ms", "mean_ms", "{:.2f}")],
                title=f"{args.rows:,} rows; ADBC/native p50: point {point_ratio:.2f}x with ? (literal "
                      f"{literal_ratio:.2f}x; goal <= {POINT_GOAL_RATIO}x), group-by {agg_ratio:.2f}x "
                      f"(goal <= {AGG_GOAL_RATIO}x)")
    print_table([{"case": "4 ADBC clients, worker killed -9", **kill}],
                [Column("case", "case"), Column("statements", "statements"), Column("failed", "failed"),
                 Column("per s", "per_s", "{:.0f}")])
    print_table([{"phase": k, **v} for k, v in phases.items()],
                [Column("phase", "phase"), Column("wall s", "wall_s", "{:.2f}"), Column("CPU s", "cpu_s", "{:.2f}"),
                 Column("load 1m", "load_1m", "{:.2f}")], title=f"load average before: {load_before}")
    write_results("flight_sql", {
        "machine": machine_info(), "load_before": load_before, "rows": args.rows, "appends": args.appends,
        "epoch": epoch, "latency": latency, "adbc_worker_kill": kill, "phases": phases,
        "ratios": {"point_prepared": round(point_ratio, 2), "point_literal": round(literal_ratio, 2),
                   "aggregate": round(agg_ratio, 2)},
        "goals": {"point_ratio": POINT_GOAL_RATIO, "aggregate_ratio": AGG_GOAL_RATIO, "failed_statements": 0}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
