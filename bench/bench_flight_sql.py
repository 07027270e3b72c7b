"""Benchmark: the gateway's Arrow Flight SQL (the ADBC driver) vs its native client, same gateway, same run.

Usage: python bench/bench_flight_sql.py [--rows 2000000] [--appends 20] [--samples 200] [--seconds 10]
       [--catalog-datasets 1,100 [--catalog-samples 200] [--catalog-only]]

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

`--catalog-datasets 1,100` adds the catalog case: what the catalog calls (GetTables with
`include_schema`, GetDbSchemas, GetCatalogs, each GetFlightInfo + DoGet with pyarrow's Flight
client, logged in as the tenant) cost as the cluster grows. The tenant keeps 1 dataset while
other tenants (2, a worker each) hold 1, then 100 datasets (tiny Delta tables pinned to their
version, so no refresher polls them); then the tenant itself holds 1, then 100. Per step: p50
and p99 latency, the gateway process's CPU per call (from /proc, over all the step's calls) and
the ratio of each against the first step, with the load average. A call's cost should follow
the tenant's own datasets only. `--catalog-only` runs that case alone (a tiny `orders` table
instead of the 2 M rows; writes bench/results/flight_sql_catalog.json).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "bench"))

from bench_speedlayer_query import AGG_SQL, POINT_SQL, Phase, percentiles, write_orders  # noqa: E402
from common import Column, closed_loop_load, machine_info, print_table, write_results  # noqa: E402

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


def adbc_worker_kill(gateway: str, rows: int, clients: int, seconds: float, kill: Callable[[], object]) -> dict:
    """Prepared point lookups by `clients` ADBC clients while `kill` runs at half time (`closed_loop_load`)."""
    @contextmanager
    def point_lookups(i: int) -> Iterator[Callable[[], None]]:
        rng = random.Random(i)
        with adbc_connection(gateway) as conn, conn.cursor() as cursor:
            def lookup() -> None:
                cursor.execute(POINT_PREPARED_SQL, parameters=(f"o-{rng.randrange(rows):09d}",))
                assert cursor.fetch_arrow_table().num_rows == 1

            yield lookup

    return closed_loop_load(point_lookups, clients, seconds, during=kill).summary("statements", "per_s")


CATALOG_TENANTS = ("neighbour-a", "neighbour-b")  # the other tenants of the catalog case


def _process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by process `pid` (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CatalogCalls:
    """The catalog calls of a Flight SQL client, made with pyarrow's Flight client (no driver
    work in the figures): GetFlightInfo, then DoGet of its one endpoint."""

    def __init__(self, gateway: str, tenant: str) -> None:
        import pyarrow.flight as flight

        from speedlayer.api import flight_sql_pb2 as sql_pb2

        self._flight = flight
        self.client = flight.connect(f"grpc://{gateway}")
        # A tenant without a token: any password (the Handshake returns the session's bearer header).
        self.options = flight.FlightCallOptions(headers=[self.client.authenticate_basic_token(tenant, "")])
        self.commands = {"GetTables": sql_pb2.CommandGetTables(include_schema=True),
                         "GetDbSchemas": sql_pb2.CommandGetDbSchemas(), "GetCatalogs": sql_pb2.CommandGetCatalogs()}

    def call(self, name: str):
        from google.protobuf import any_pb2

        packed = any_pb2.Any()
        packed.Pack(self.commands[name])
        info = self.client.get_flight_info(self._flight.FlightDescriptor.for_command(packed.SerializeToString()),
                                           self.options)
        return self.client.do_get(info.endpoints[0].ticket, self.options).read_all()

    def tables(self) -> dict[str, int]:
        """{table: number of columns of its schema} as GetTables lists them."""
        import pyarrow as pa

        listed = self.call("GetTables").to_pylist()
        return {row["table_name"]: len(pa.ipc.read_schema(pa.py_buffer(row["table_schema"]))) for row in listed}

    def close(self) -> None:
        self.client.close()


def _tiny_table(path: str, seed: int) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    write_deltalake(path, pa.table({"id": pa.array(range(seed, seed + 10), pa.int64()),
                                    "name": [f"n-{i}" for i in range(10)]}))


def _admit_tiny(client, root: Path, gateway: str, tenant: str, names: list[str]) -> None:
    """Admit a tiny Delta table (pinned to version 0) per name for `tenant`; return once the
    gateway lists every one of them with its schema (READY, seen by the gateway's cache)."""
    from speedlayer.clients import delta_request

    for i, name in enumerate(names):
        path = root / "catalog" / tenant / name
        _tiny_table(str(path), i)
        reply = client.admit(delta_request(tenant, name, str(path), replication=1, version=0))
        if reply.status not in ("ASSIGNED", "PLANNED"):
            raise RuntimeError(f"admission of {tenant}/{name} refused: {reply.status} {reply.message}")
    calls = CatalogCalls(gateway, tenant)
    try:
        deadline = time.monotonic() + 150
        while True:
            listed = calls.tables()
            if all(listed.get(name) for name in names):
                return
            if time.monotonic() > deadline:
                missing = [n for n in names if not listed.get(n)]
                raise RuntimeError(f"{tenant}: {len(missing)} datasets not listed with a schema: {missing[:5]}")
            time.sleep(0.5)
    finally:
        calls.close()


def _measure_catalog(gateway: str, gateway_pid: int, samples: int) -> dict:
    """Per catalog call: latency percentiles and the gateway's CPU ms per call, calls interleaved."""
    calls = CatalogCalls(gateway, TENANT)
    try:
        for name in calls.commands:  # warm: schemas probed, caches filled
            for _ in range(20):
                calls.call(name)
        latencies: dict[str, list[float]] = {name: [] for name in calls.commands}
        cpu_s = dict.fromkeys(calls.commands, 0.0)
        load = round(os.getloadavg()[0], 2)
        block = min(50, samples)
        for _ in range(max(1, samples // block)):  # blocks of each call in turn: the same load for each
            for name in calls.commands:
                cpu0 = _process_cpu_s(gateway_pid)
                latencies[name] += [_timed(lambda n=name: calls.call(n)) for _ in range(block)]
                cpu_s[name] += _process_cpu_s(gateway_pid) - cpu0
        out = {name: {**percentiles(ms), "gateway_cpu_ms": round(cpu_s[name] * 1000 / len(ms), 3)}
               for name, ms in latencies.items()}
        tables = len(calls.tables())
        return {"calls": out, "tables_listed": tables, "load_1m_before": load, "load_1m": round(os.getloadavg()[0], 2)}
    finally:
        calls.close()


def catalog_phase(layer, root: Path, scales: list[int], samples: int) -> dict:
    """The catalog case (see the module docstring): steps of (own datasets, other tenants'
    datasets), each measured; ratios against the first step."""
    from speedlayer.clients import ManagementClient

    client = ManagementClient([layer.master], deadline_s=60)
    try:
        for i, tenant in enumerate(CATALOG_TENANTS):  # the other tenants' workers (one each)
            layer._spawn(f"worker-n{i}", "worker", "--tenant", tenant, "--id", f"n{i}", "--masters", layer.master,
                         "--memory-mb", "512", "--threads", "1")
        deadline = time.monotonic() + 60
        while not all(client.workers(t).workers for t in CATALOG_TENANTS):
            if time.monotonic() > deadline:
                raise RuntimeError("the other tenants' workers did not register")
            time.sleep(0.2)
        own, others = 1, 0  # the tenant's `orders`; the other tenants' datasets
        steps = [(scales[0], scale) for scale in scales] + [(scale, scales[-1]) for scale in scales[1:]]
        results = []
        for own_n, other_n in steps:
            for i, tenant in enumerate(CATALOG_TENANTS):  # spread over the other tenants
                names = [f"d{n:04d}" for n in range(others, other_n) if n % len(CATALOG_TENANTS) == i]
                if names:
                    _admit_tiny(client, root, layer.gateway, tenant, names)
            if own_n > own:
                _admit_tiny(client, root, layer.gateway, TENANT, [f"t{n:04d}" for n in range(own, own_n)])
            own, others = max(own, own_n), max(others, other_n)
            measured = _measure_catalog(layer.gateway, layer.processes["gateway"].pid, samples)
            assert measured["tables_listed"] == own_n, measured
            results.append({"own_datasets": own_n, "other_datasets": other_n, **measured})
        base = results[0]["calls"]
        for step in results:
            for name, figures in step["calls"].items():
                figures["p50_ratio"] = round(figures["p50_ms"] / base[name]["p50_ms"], 2)
                figures["cpu_ratio"] = round(figures["gateway_cpu_ms"] / max(base[name]["gateway_cpu_ms"], 1e-3), 2)
        return {"samples": samples, "other_tenants": list(CATALOG_TENANTS), "steps": results}
    finally:
        client.close()


def print_catalog(catalog: dict) -> None:
    rows = [{"step": f"own {s['own_datasets']}, others {s['other_datasets']}", "call": name, **figures,
             "load": s["load_1m"]} for s in catalog["steps"] for name, figures in s["calls"].items()]
    print_table(rows, [Column("datasets", "step"), Column("call", "call"), Column("p50 ms", "p50_ms", "{:.2f}"),
                       Column("p99 ms", "p99_ms", "{:.2f}"), Column("gw CPU ms/call", "gateway_cpu_ms", "{:.2f}"),
                       Column("p50 x", "p50_ratio", "{:.2f}"), Column("CPU x", "cpu_ratio", "{:.2f}"),
                       Column("load 1m", "load", "{:.2f}")],
                title=f"catalog calls, {catalog['samples']} each per step; ratios against the first step")


def main() -> int:
    from danube_core.embedded_etcd import EmbeddedEtcd
    from devstack.speedlayer_stack import EmbeddedSpeedLayer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--appends", type=int, default=20, help="Delta commits (the pipeline's micro-batches)")
    parser.add_argument("--samples", type=int, default=200, help="point lookups timed per client")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the worker-kill load")
    parser.add_argument("--catalog-datasets", default="",
                        help="run the catalog case with these dataset counts, e.g. 1,100 (see above)")
    parser.add_argument("--catalog-samples", type=int, default=200, help="calls timed per catalog call and step")
    parser.add_argument("--catalog-only", action="store_true", help="run the catalog case alone")
    args = parser.parse_args()
    scales = sorted({int(n) for n in args.catalog_datasets.split(",") if n.strip()})
    if args.catalog_only and not scales:
        parser.error("--catalog-only needs --catalog-datasets, e.g. 1,100")
    if scales and scales[0] < 1:
        parser.error(f"--catalog-datasets {args.catalog_datasets!r}: counts of at least 1")
    load_before = round(os.getloadavg()[0], 2)
    phases: dict = {}
    root = Path(tempfile.mkdtemp(prefix="bench-flight-sql-"))
    etcd = layer = None
    latency = kill = catalog = None
    try:
        with Phase("write_table", phases):
            if args.catalog_only:
                _tiny_table(str(root / "orders"), 0)
            else:
                write_orders(str(root / "orders"), args.rows, args.appends)
        etcd = EmbeddedEtcd(str(root / "etcd"))
        layer = EmbeddedSpeedLayer(root / "speedlayer", etcd.endpoint, tenant=TENANT)
        with Phase("start_admit", phases):
            layer.start(workers=1 if args.catalog_only else 2, worker_memory_mb=2048, worker_threads=1)
            epoch = layer.admit("orders", str(root / "orders"), replication=1 if args.catalog_only else 2)
            layer.wait_queryable("orders")
        if not args.catalog_only:
            with Phase("latency", phases):
                latency = latency_phase(layer.gateway, args.rows, args.samples)
        if scales:  # before the worker kill: the tenant's datasets need their worker
            with Phase("catalog", phases):
                catalog = catalog_phase(layer, root, scales, args.catalog_samples)
        if not args.catalog_only:
            with Phase("adbc_worker_kill", phases):
                kill = adbc_worker_kill(layer.gateway, args.rows, 4, args.seconds, lambda: layer.kill("worker-w1"))
    finally:
        if layer is not None:
            layer.stop()
        if etcd is not None:
            etcd.stop()
        shutil.rmtree(root, ignore_errors=True)
    if latency is None or kill is None:
        assert catalog is not None
        print_catalog(catalog)
        print_phases(phases, load_before)
        write_results("flight_sql_catalog", {"machine": machine_info(), "load_before": load_before,
                                             "catalog": catalog, "phases": phases})
        return 0
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
    if catalog is not None:
        print_catalog(catalog)
    print_phases(phases, load_before)
    write_results("flight_sql", {
        "machine": machine_info(), "load_before": load_before, "rows": args.rows, "appends": args.appends,
        "epoch": epoch, "latency": latency, "adbc_worker_kill": kill, "phases": phases, "catalog": catalog,
        "ratios": {"point_prepared": round(point_ratio, 2), "point_literal": round(literal_ratio, 2),
                   "aggregate": round(agg_ratio, 2)},
        "goals": {"point_ratio": POINT_GOAL_RATIO, "aggregate_ratio": AGG_GOAL_RATIO, "failed_statements": 0}})
    return 0


def print_phases(phases: dict, load_before: float) -> None:
    print_table([{"phase": k, **v} for k, v in phases.items()],
                [Column("phase", "phase"), Column("wall s", "wall_s", "{:.2f}"), Column("CPU s", "cpu_s", "{:.2f}"),
                 Column("load 1m", "load_1m", "{:.2f}")], title=f"load average before: {load_before}")


if __name__ == "__main__":
    sys.exit(main())
