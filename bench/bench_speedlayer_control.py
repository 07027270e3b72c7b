"""Benchmark: the speed layer's control plane on one host, each figure with a same-run baseline.

Usage: python bench/bench_speedlayer_control.py [--failovers 3] [--admissions 40] [--files 1000]

* Leader failover: 3 masters (election TTL `--ttl`); kill -9 of the leader -> the first
  mutation (a quota write, which only the leader serves) answered by the new leader. Baseline:
  the lease TTL, which bounds detection.
* Worker loss: 3 workers (real processes), an epoch on two of them; kill -9 of one -> the
  epoch READY on two workers again. Baseline: the same epoch's first admission -> READY, and the
  lease TTL + reassignment delay, which bound detection.
* Admission -> ASSIGNED for a Delta table of `--files` files (each admission a new dataset, so a
  new epoch: log read, quota check, plan, placement, etcd writes). Goal p99 <= 200 ms. Baseline:
  reading the same Delta log alone (deltalake, no master), and an idempotent retry. Workers here
  are stubs (one process) that register and heartbeat but load nothing, so loads do not compete
  for the 2 CPUs with the admissions being timed.

Writes bench/results/speedlayer_control.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "bench"))

from common import Column, machine_info, print_table, wait_for, write_results  # noqa: E402
from pyspy_profile import print_summary, profile_processes  # noqa: E402

from speedlayer.clients import delta_request  # noqa: E402
from speedlayer.records import GlobalConfig  # noqa: E402
from devstack.speedlayer_cluster import SpeedLayerCluster, ready_workers  # noqa: E402

GOAL_P99_MS = 200


def write_table(path: str, files: int, rows_per_file: int = 50) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    n = files * rows_per_file
    table = pa.table({"id": pa.array(range(n), pa.int64()), "part": pa.array([i % files for i in range(n)], pa.int32()),
                      "amount": pa.array([i * 0.25 for i in range(n)], pa.float64())})
    write_deltalake(path, table, partition_by=["part"])


def bench_failover(root: Path, rounds: int, ttl_s: int) -> dict:
    cluster = SpeedLayerCluster(root / "failover", election_ttl_s=ttl_s)
    samples = []
    try:
        for name in ("m1", "m2", "m3"):
            cluster.start_master(name)
        client = cluster.client(deadline_s=60)
        for index in range(rounds):
            wait_for(lambda index=index: client.quota("bench", memory_quota_bytes=index + 1))
            leader = cluster.leader_id()
            killed = time.perf_counter()
            cluster.kill_master(leader)
            wait_for(lambda index=index: client.quota("bench", memory_quota_bytes=index + 100), interval_s=0.01)
            samples.append(time.perf_counter() - killed)
            cluster.start_master(leader)
    finally:
        cluster.stop()
    return {"lease_ttl_s": ttl_s, "failover_s": [round(s, 3) for s in samples],
            "failover_mean_s": round(statistics.mean(samples), 3), "failover_max_s": round(max(samples), 3)}


def bench_worker_loss(root: Path, ttl_heartbeat_s: int, delay_s: float, table: str) -> dict:
    cluster = SpeedLayerCluster(root / "workers", heartbeat_s=ttl_heartbeat_s, reassign_delay_s=delay_s)
    try:
        cluster.start_master("m1")
        for worker in ("w1", "w2", "w3"):
            cluster.start_worker("acme", worker)
        client = cluster.client(deadline_s=60)
        wait_for(lambda: len(client.workers("acme").workers) == 3)
        started = time.perf_counter()
        reply = client.admit(delta_request("acme", "orders", table))
        before = wait_for(lambda: len(r := ready_workers(client, "acme", "orders", reply.epoch_id)) == 2 and r)
        first_ready_s = time.perf_counter() - started
        victim = sorted(before)[0]
        killed = time.perf_counter()
        cluster.kill_worker(f"acme/{victim}")
        wait_for(lambda: len(r := ready_workers(client, "acme", "orders", reply.epoch_id)) == 2 and victim not in r,
                 interval_s=0.05)
        recovery_s = time.perf_counter() - killed
    finally:
        cluster.stop()
    return {"worker_lease_ttl_s": 3 * ttl_heartbeat_s, "reassign_delay_s": delay_s,
            "detection_bound_s": 3 * ttl_heartbeat_s + delay_s, "first_admission_to_ready_s": round(first_ready_s, 3),
            "kill_to_ready_elsewhere_s": round(recovery_s, 3)}


def run_stub_workers(masters: list[str], count: int) -> None:
    """Workers that register and heartbeat but never load (control-plane timing only); run in
    a process of their own so that parsing the plans they receive does not slow the timed client."""
    from speedlayer.config import WorkerConfig
    from speedlayer.worker.agent import WorkerAgent

    class Stub(WorkerAgent):
        def _assigned(self, event) -> None:
            return None

    agents = [Stub(WorkerConfig(tenant="bench", worker_id=f"s{i}", masters=masters, memory_bytes=0))
              for i in range(count)]
    threads = [threading.Thread(target=a.run, daemon=True) for a in agents]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def start_stub_workers(masters: list[str], count: int):
    import json
    import os
    import subprocess

    code = ("import sys, json; sys.path[:0] = json.loads(sys.argv[1]); import bench_speedlayer_control as b; "
            "b.run_stub_workers(json.loads(sys.argv[2]), int(sys.argv[3]))")
    paths = [str(REPO_ROOT), str(REPO_ROOT / "bench")]
    return subprocess.Popen([sys.executable, "-c", code, json.dumps(paths), json.dumps(masters), str(count)],
                            env=dict(os.environ), stdout=subprocess.DEVNULL)


def bench_admission(root: Path, count: int, table: str) -> dict:
    from deltalake import DeltaTable

    cluster = SpeedLayerCluster(root / "admission")
    stubs = None
    try:
        cluster.set_global(GlobalConfig(reassign_delay_s=1.0))
        cluster.start_master("m1")
        stubs = start_stub_workers(cluster.master_addresses, 3)
        client = cluster.client(deadline_s=60)
        wait_for(lambda: len(client.workers("bench").workers) == 3)
        client.admit(delta_request("bench", "warmup", table))
        admit_ms, statuses = [], set()
        for index in range(count):
            started = time.perf_counter()
            reply = client.admit(delta_request("bench", f"ds{index}", table))
            admit_ms.append((time.perf_counter() - started) * 1000)
            statuses.add(reply.status)
        retry_ms = []
        for index in range(min(count, 20)):
            started = time.perf_counter()
            client.admit(delta_request("bench", f"ds{index}", table))
            retry_ms.append((time.perf_counter() - started) * 1000)
        log_ms = []
        for _ in range(min(count, 20)):
            started = time.perf_counter()
            dt = DeltaTable(table)
            dt.get_add_actions(flatten=True)
            log_ms.append((time.perf_counter() - started) * 1000)
        files = client.status("bench", "ds0").epochs[0].file_count
        masters = [process.pid for process, _ in cluster.masters.values()]
        profile = profile_processes(masters, lambda: [client.admit(delta_request("bench", f"profiled{index}", table))
                                                      for index in range(min(count, 20))])
    finally:
        if stubs is not None:
            stubs.kill()
            stubs.wait(10)
        cluster.stop()
    ordered = sorted(admit_ms)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return {"admissions": count, "files": files, "statuses": sorted(statuses),
            "admit_p50_ms": round(statistics.median(admit_ms), 1), "admit_p99_ms": round(p99, 1),
            "admit_max_ms": round(max(admit_ms), 1), "goal_p99_ms": GOAL_P99_MS,
            "baseline_delta_log_read_p50_ms": round(statistics.median(log_ms), 1),
            "baseline_idempotent_retry_p50_ms": round(statistics.median(retry_ms), 1),
            "profile": {"case": f"{min(count, 20)} more admissions, untimed", "processes": "the master (py-spy)",
                        **profile}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--failovers", type=int, default=3)
    parser.add_argument("--ttl", type=int, default=2, help="master election lease TTL, seconds")
    parser.add_argument("--admissions", type=int, default=40)
    parser.add_argument("--files", type=int, default=1000)
    args = parser.parse_args()
    load_start = round(os.getloadavg()[0], 2)
    root = Path(tempfile.mkdtemp(prefix="bench-speedlayer-"))
    table = str(root / "table")
    write_table(table, args.files)
    small = str(root / "small")
    write_table(small, 12, rows_per_file=5000)
    failover = bench_failover(root, args.failovers, args.ttl)
    workers = bench_worker_loss(root, 1, 1.0, small)
    admission = bench_admission(root, args.admissions, table)
    print_table([
        {"case": f"leader failover (kill -9 -> new leader answers), {args.failovers} runs",
         "measured": f"mean {failover['failover_mean_s']} s, max {failover['failover_max_s']} s",
         "baseline": f"lease TTL {args.ttl} s"},
        {"case": "worker kill -9 -> its epoch READY on 2 workers again",
         "measured": f"{workers['kill_to_ready_elsewhere_s']} s",
         "baseline": f"TTL+delay {workers['detection_bound_s']} s; first load {workers['first_admission_to_ready_s']} s"},
        {"case": f"admission -> ASSIGNED, {admission['files']} files, {args.admissions} runs",
         "measured": f"p50 {admission['admit_p50_ms']} ms, p99 {admission['admit_p99_ms']} ms (goal <= {GOAL_P99_MS})",
         "baseline": f"log read {admission['baseline_delta_log_read_p50_ms']} ms; retry {admission['baseline_idempotent_retry_p50_ms']} ms"},
    ], [Column("case", "case"), Column("measured", "measured"), Column("baseline (same run)", "baseline")],
        title=f"load at start {load_start}")
    print_summary("admission hot path, the master (own samples)", admission["profile"])
    write_results("speedlayer_control", {"machine": machine_info(), "load_average_1m_start": load_start,
                                         "failover": failover,
                                         "worker_loss": workers, "admission": admission})
    return 0


if __name__ == "__main__":
    sys.exit(main())
