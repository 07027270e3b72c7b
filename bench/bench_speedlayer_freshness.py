"""Benchmark: a Delta commit -> visible in the speed layer, against Spark seeing the same commit.

Usage: python bench/bench_speedlayer_freshness.py [--rows 200000] [--commits 20] [--append 2000]

Real processes on loopback: etcd, one master, one worker (Arrow Flight), one Data Gateway. The
table (`--rows` rows, 3 partitions) is admitted and followed; then, in turn on the same table,
each case appends `--append` rows with deltalake and measures from the commit's return until a
`SELECT count(*)` answers with the new row count:
* announced, through the gateway: the commit announced as a pipeline does (`CommitAnnouncer`,
  after the commit); the query goes to the gateway, which routes to the newest READY epoch;
* announced, at the worker: the same query straight to the worker's Flight service (its newest
  published epoch: no wait for the master to record READY and the gateway to see it);
* unannounced, through the gateway: found by the master's poll (`refresh_poll_interval_s` =
  `--poll-s`);
* baseline: `spark.read.format("delta").load(path).count()` right after the commit (local[2],
  the pipelines' session settings, session start not timed).
Goal: announced through the gateway p50 <= 1 s, p99 <= 3 s. Reports the load, CPU seconds (this
process tree: etcd, master, worker, gateway, Spark JVM) and wall time per case. Writes
bench/results/speedlayer_freshness.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "bench"))

from common import Column, machine_info, print_table, tree_cpu_s, write_results  # noqa: E402
from pyspy_profile import print_summary, profile_processes  # noqa: E402

GOAL_P50_S, GOAL_P99_S = 1.0, 3.0


def append(path: str, start: int, rows: int) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    ids = range(start, start + rows)
    write_deltalake(path, pa.table({"id": pa.array(ids, pa.int64()), "amount": pa.array([i * 0.5 for i in ids]),
                                    "day": [f"2024-01-0{i % 3 + 1}" for i in ids]}),
                    partition_by=["day"], mode="append")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summary(case: str, latencies: list[float], cpu_s: float, wall_s: float) -> dict:
    return {"case": case, "commits": len(latencies), "p50_s": round(statistics.median(latencies), 3),
            "p99_s": round(percentile(latencies, 0.99), 3), "max_s": round(max(latencies), 3),
            "cpu_s": round(cpu_s, 2), "wall_s": round(wall_s, 2)}


def wait_visible(client, rows: int, deadline_s: float = 60.0, first: bool = False) -> float:
    """Query until the answer counts `rows`; returns the monotonic time it first did. A count
    above `rows` (rows twice) or below it after a newer one (half an epoch) fails the run, as
    does any query error once the dataset is served (`first`: it may not be yet)."""
    from speedlayer.errors import NotFoundError, ReplicaUnavailableError

    deadline, best = time.monotonic() + deadline_s, -1
    while time.monotonic() < deadline:
        try:
            count = client.query("orders", "SELECT count(*) AS n FROM orders").column("n")[0].as_py()
        except (NotFoundError, ReplicaUnavailableError):
            if not first:
                raise
            time.sleep(0.05)
            continue
        if count == rows:
            return time.monotonic()
        if count > rows or count < best:
            raise AssertionError(f"the speed layer answered {count} rows (expected {rows}, had seen {best})")
        best = count
        time.sleep(0.005)
    raise TimeoutError(f"{rows} rows not visible within {deadline_s}s")


class Run:
    """The cluster (etcd, master, worker, gateway), the followed table and its row count."""

    def __init__(self, root: Path, rows: int, poll_s: float) -> None:
        from speedlayer.clients import delta_request
        from speedlayer.clients.query_client import QueryClient
        from speedlayer.records import GlobalConfig
        from devstack.speedlayer_cluster import SpeedLayerCluster

        self.cluster = SpeedLayerCluster(root / "cluster")
        self.cluster.set_global(GlobalConfig(replication_factor=1, refresh_poll_interval_s=poll_s,
                                             default_ttl_sec=5.0, evicted_retention_s=5.0))
        self.cluster.start_master("m1")
        self.cluster.start_worker("bench", "w1", memory_mb=2048)
        gateway = self.cluster.start_gateway()
        self.path, self.rows, self.version = str(root / "orders"), rows, 0
        append(self.path, 0, rows)
        client = self.cluster.client()
        deadline = time.monotonic() + 60
        while not client.workers("bench").workers and time.monotonic() < deadline:
            time.sleep(0.05)
        worker = client.workers("bench").workers[0].address
        client.admit(delta_request("bench", "orders", self.path))
        self.gateway = QueryClient(gateway, "bench", client_id="bench")
        self.worker = QueryClient(worker, "bench", client_id="bench")
        wait_visible(self.gateway, rows, first=True)

    def commit(self, rows: int) -> float:
        append(self.path, self.rows, rows)
        self.rows, self.version = self.rows + rows, self.version + 1
        return time.monotonic()

    def announce(self) -> None:
        from pipelines.speedlayer_feed import CommitAnnouncer, SpeedLayerFeed

        CommitAnnouncer(SpeedLayerFeed("bench", "orders"), self.path, "bench", self.cluster.metadata).announce()

    def server_pids(self) -> list[int]:
        """The master, worker and gateway processes (for the profile)."""
        cluster = self.cluster
        return ([p.pid for p, _ in cluster.masters.values()] + [p.pid for p in cluster.workers.values()]
                + [p.pid for p, _ in cluster.gateways.values()])

    def stop(self) -> None:
        self.gateway.close()
        self.worker.close()
        self.cluster.stop()


def spark_session():
    """The pipelines' own session (their small-machine defaults: few shuffle and Delta snapshot
    partitions), so the baseline is Spark as this project runs it."""
    from pipelines.session import build_session

    spark = build_session("bench-speedlayer-freshness", master="local[2]", conf={"spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("WARN")
    return spark


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000, help="rows in the table before the commits")
    parser.add_argument("--commits", type=int, default=20, help="commits measured per case")
    parser.add_argument("--append", type=int, default=2_000, help="rows per commit")
    parser.add_argument("--poll-s", type=float, default=1.0, help="the master's poll interval (unannounced case)")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-freshness-") as tmp:
        run = Run(Path(tmp), args.rows, args.poll_s)
        spark = spark_session()
        try:
            spark.read.format("delta").load(run.path).count()  # warm: JVM classes, the Delta log cache
            cases: dict[str, list[float]] = {"gateway": [], "worker": [], "polled": [], "spark": []}
            cost: dict[str, list[float]] = {k: [0.0, 0.0] for k in cases}
            for _ in range(args.commits):
                for case in cases:
                    cpu0, wall0 = tree_cpu_s(), time.perf_counter()
                    committed = run.commit(args.append)
                    if case == "spark":
                        count = spark.read.format("delta").load(run.path).count()
                        assert count == run.rows, (count, run.rows)
                        seen = time.monotonic()
                    else:
                        if case != "polled":
                            run.announce()
                        seen = wait_visible(run.worker if case == "worker" else run.gateway, run.rows)
                    cases[case].append(seen - committed)
                    cost[case][0] += tree_cpu_s() - cpu0
                    cost[case][1] += time.perf_counter() - wall0
            kinds = _epoch_kinds(run)
            profile = profile_processes(run.server_pids(), lambda: [
                (run.commit(args.append), run.announce(), wait_visible(run.gateway, run.rows)) for _ in range(5)])
        finally:
            spark.stop()
            run.stop()
    rows = [summary("announced, through the gateway", cases["gateway"], *cost["gateway"]),
            summary("announced, at the worker (Flight)", cases["worker"], *cost["worker"]),
            summary(f"found by the master's poll ({args.poll_s:g} s), gateway", cases["polled"], *cost["polled"]),
            summary("baseline: Spark count() right after the commit", cases["spark"], *cost["spark"])]
    load_after = os.getloadavg()
    ratio = rows[3]["p50_s"] / rows[0]["p50_s"]
    print_table(rows, [Column("case", "case"), Column("commits", "commits"), Column("p50 s", "p50_s", "{:.3f}"),
                       Column("p99 s", "p99_s", "{:.3f}"), Column("max s", "max_s", "{:.3f}"),
                       Column("CPU s", "cpu_s", "{:.1f}"), Column("wall s", "wall_s", "{:.1f}")],
                title=f"commit -> visible, {args.rows:,} rows + {args.append:,} a commit; Spark's p50 is "
                      f"{ratio:.1f}x the gateway's (goal p50 <= {GOAL_P50_S} s, p99 <= {GOAL_P99_S} s); "
                      f"load {load_before[0]:.1f} -> {load_after[0]:.1f}")
    print_summary("hot path of 5 announced commits, master, worker and gateway (own samples)", profile)
    write_results("speedlayer_freshness", {
        "machine": machine_info(), "load_average_before": load_before, "load_average_after": load_after,
        "rows": args.rows, "append": args.append, "commits": args.commits, "poll_s": args.poll_s,
        "cases": rows, "epoch_kinds": kinds, "spark_p50_over_gateway_p50": round(ratio, 2),
        "goal": {"p50_s": GOAL_P50_S, "p99_s": GOAL_P99_S},
        "met": rows[0]["p50_s"] <= GOAL_P50_S and rows[0]["p99_s"] <= GOAL_P99_S,
        "profile": {"case": "5 announced commits, untimed", "processes": "master, worker, gateway (py-spy)",
                    **profile},
    })
    return 0


def _epoch_kinds(run: Run) -> dict[str, int]:
    """Epochs planned during the run by kind, and evictions, from the master's audit trail."""
    from speedlayer.observability.audit import read_audit_log

    counts: dict[str, int] = {}
    for event in read_audit_log(str(run.cluster.root / "speedlayer-audit-m1.jsonl")):
        if event.get("kind") == "admission.PENDING":
            name = f"{event.get('detail', {}).get('kind', 'full')} planned"
        elif event.get("kind") == "epoch.EVICTED":
            name = f"evicted ({event.get('detail', {}).get('reason')})"
        else:
            continue
        counts[name] = counts.get(name, 0) + 1
    return counts


if __name__ == "__main__":
    sys.exit(main())
