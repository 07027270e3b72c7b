"""Benchmark: the speed layer's control plane at scale (issue 26): 100 workers, 2,000 datasets.

Usage: python bench/bench_speedlayer_scale.py [--workers 100] [--datasets 2000] [--replication 2]
       [--masters 3] [--per-process 33] [--watchers 3] [--out speedlayer_scale] [--profile]

Real etcd (one of its own), `--masters` real master processes, and `--workers` simulated
workers (`bench/speedlayer_agents.py`: the product's worker agent, speaking the real
EventStream, acknowledging plans as READY without reading them) in processes of
`--per-process` agents, plus one process holding a single agent (the one killed). Datasets
are admitted one after another from this process, all over one small Delta table (each
dataset its own epoch; each follows the table, as an admission at the latest version does).
`--watchers` etcd watches on `/assignments/` and `/workers/` stand in for gateways.

Measured, in order:
* admission -> answered, p50/p99 over all admissions, and the same at 1 worker / 20 datasets
  (a cluster of its own, first): the ratio;
* every epoch READY on `--replication` workers; etcd keys and bytes per epoch by prefix; what a
  new leader reads at takeover (the prefixes `ClusterState.load` and the refresher read);
* an idle window: lease keep-alives/s and puts/s at etcd (heartbeat load), watch events per
  watcher per second, the leader's CPU per second at rest;
* leader kill -9 -> a new leader answering a mutation (vs the election TTL), and the replicas
  moved by the failover (placement before the kill vs after the takeover window: goal 0);
* one worker kill -9 -> every epoch it held READY on `--replication` other workers (vs the
  worker lease TTL + reassignment delay);
* masters' RSS (peak), CPU seconds of every process, watch events per watcher per admission.

Writes bench/results/<out>.json. `--profile`: py-spy on the leader master during the admissions
(the functions with the most CPU samples, in the JSON's `leader_profile`); the timings of a
profiled run are not the benchmark's figures.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "bench"))

from common import Column, machine_info, print_table, wait_for, write_results  # noqa: E402

from danube_core.metadata_etcd import EtcdMetadataStore  # noqa: E402
from speedlayer.clients import delta_request  # noqa: E402
from speedlayer.records import R_READY, AssignmentRecord, GlobalConfig  # noqa: E402
from devstack.speedlayer_cluster import SpeedLayerCluster  # noqa: E402

TENANT = "bench"
GOAL_ADMIT_P99_MS = 200
GOAL_RSS_MB = 1024
DEADLINE_S = 300.0  # 2,000 admissions on a loaded 2-core machine take minutes


def proc_cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_memory_mb(pid: int) -> dict[str, float]:
    values = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                values[name] = round(int(rest.split()[0]) / 1024, 1)
    except OSError:
        pass
    return values


def etcd_metrics(endpoint: str) -> dict[str, float]:
    """etcd's Prometheus counters (its /metrics on the client URL), summed over label sets we name."""
    text = urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10).read().decode()
    wanted = {
        "keepalives": ('grpc_server_msg_received_total{', 'grpc_method="LeaseKeepAlive"'),
        "puts": ("etcd_mvcc_put_total", ""),
        "txns": ("etcd_mvcc_txn_total", ""),
        "proposals": ("etcd_server_proposals_committed_total", ""),
        "range_calls": ('grpc_server_handled_total{', 'grpc_method="Range"'),
        "sent_bytes": ("etcd_network_client_grpc_sent_bytes_total", ""),
    }
    out = dict.fromkeys(wanted, 0.0)
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        for name, (start, contains) in wanted.items():
            if line.startswith(start) and contains in line:
                out[name] += float(line.rsplit(" ", 1)[1])
    return out


def rates(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    return {k: round((after[k] - before[k]) / seconds, 1) for k in before}


class Watchers:
    """Gateway stand-ins: each an etcd client of its own watching what the gateway watches."""

    def __init__(self, endpoint: str, keys, count: int) -> None:
        self.events = [0] * count
        self._stores = [EtcdMetadataStore(endpoint) for _ in range(count)]
        self._lock = threading.Lock()
        self._handles = []
        for index, store in enumerate(self._stores):
            for prefix in (keys.assignments_prefix, keys.workers_prefix):
                self._handles.append(store.watch_prefix(prefix, lambda event, i=index: self._count(i)))

    def _count(self, index: int) -> None:
        with self._lock:
            self.events[index] += 1

    def total(self) -> float:
        with self._lock:
            return sum(self.events) / max(1, len(self.events))

    def close(self) -> None:
        for handle in self._handles:
            handle.cancel()
        for store in self._stores:
            store.close()


def records(store: EtcdMetadataStore, keys) -> dict[str, AssignmentRecord]:
    return {key: AssignmentRecord.from_json(raw, key) for key, raw in store.get_prefix(keys.assignments_prefix)}


def all_ready(store: EtcdMetadataStore, keys, datasets: int, replication: int) -> bool:
    found = records(store, keys)
    return len(found) >= datasets and all(len(r.ready_workers()) >= replication for r in found.values())


def key_figures(store: EtcdMetadataStore, keys) -> dict[str, dict[str, int]]:
    """Keys and bytes (key + value) under each of the speed layer's prefixes."""
    figures: dict[str, dict[str, int]] = {}
    for key, value in store.get_prefix(keys.root + "/"):
        name = key[len(keys.root) + 1:].split("/", 1)[0]
        entry = figures.setdefault(name, {"keys": 0, "bytes": 0})
        entry["keys"] += 1
        entry["bytes"] += len(key) + len(value)
    return figures


def start_agents(cluster: SpeedLayerCluster, prefix: str, first: int, count: int) -> subprocess.Popen:
    log = open(cluster.root / f"agents-{prefix}{first}.log", "ab")
    process = subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "bench" / "speedlayer_agents.py"), "--masters",
         ",".join(cluster.master_addresses), "--tenant", TENANT, "--prefix", prefix, "--first", str(first),
         "--count", str(count)], stdout=subprocess.PIPE, stderr=log, env=cluster._env())
    assert process.stdout is not None
    line = process.stdout.readline().decode()
    if not line.startswith("agents started"):
        raise RuntimeError(f"agent process said {line!r}; see {log.name}")
    return process


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def placement(found: dict[str, AssignmentRecord]) -> dict[str, set[str]]:
    return {key: set(r.staying()) for key, r in found.items()}


class ScaleRun:
    def __init__(self, root: Path, args: argparse.Namespace, workers: int, datasets: int, table: str) -> None:
        self.args, self.workers, self.datasets, self.table = args, workers, datasets, table
        self.cluster = SpeedLayerCluster(root, election_ttl_s=args.ttl, heartbeat_s=args.heartbeat,
                                         reassign_delay_s=args.delay)
        self.replication = min(args.replication, workers)
        self.cluster.set_global(GlobalConfig(reassign_delay_s=args.delay, replication_factor=self.replication))
        self.keys = self.cluster.keys
        self.store = self.cluster.metadata
        self.agents: list[subprocess.Popen] = []
        self.victim: subprocess.Popen | None = None
        self.cpu: dict[str, float] = {}
        self.report: dict = {"workers": workers, "datasets": datasets, "replication": self.replication,
                             "masters": args.masters}

    def master_pids(self) -> dict[str, int]:
        return {name: process.pid for name, (process, _) in self.cluster.masters.items()}

    def start(self) -> None:
        for index in range(self.args.masters):
            self.cluster.start_master(f"m{index + 1}")
        wait_for(lambda: self.cluster.leader_id(), DEADLINE_S)
        others = self.workers - 1 if self.workers > 1 else self.workers
        for first in range(0, others, self.args.per_process):
            self.agents.append(start_agents(self.cluster, "w", first, min(self.args.per_process, others - first)))
        if self.workers > 1:
            self.victim = start_agents(self.cluster, "v", 0, 1)
        started = time.perf_counter()
        wait_for(lambda: len(self.store.get_prefix(self.keys.workers_prefix, keys_only=True)) == self.workers, DEADLINE_S)
        self.report["all_registered_s"] = round(time.perf_counter() - started, 2)

    def admit(self, watchers: Watchers) -> None:
        client = self.cluster.client(deadline_s=60)
        client.admit(delta_request(TENANT, "warmup", self.table))
        events_before = watchers.total()
        cpu_before = {n: proc_cpu_s(p) for n, p in self.master_pids().items()}
        admit_ms: list[float] = []
        started = time.perf_counter()

        def admit_all() -> None:
            for index in range(self.datasets - 1):
                t0 = time.perf_counter()
                client.admit(delta_request(TENANT, f"ds{index}", self.table))
                admit_ms.append((time.perf_counter() - t0) * 1000)

        if self.args.profile:  # py-spy on the leader: where its CPU goes (the figures of such a run are not kept)
            from pyspy_profile import profile_processes

            leader_pid = self.master_pids()[self.cluster.leader_id() or ""]
            self.report["leader_profile"] = profile_processes([leader_pid], admit_all, top=30)
        else:
            admit_all()
        wall = time.perf_counter() - started
        wait_for(lambda: all_ready(self.store, self.keys, self.datasets, self.replication), DEADLINE_S, 0.5)
        ready_s = time.perf_counter() - started
        leader = self.cluster.leader_id() or ""
        last = admit_ms[-max(1, len(admit_ms) // 10):]
        self.report["admission"] = {
            "count": len(admit_ms), "wall_s": round(wall, 1), "per_s": round(len(admit_ms) / wall, 1),
            "p50_ms": round(statistics.median(admit_ms), 1), "p99_ms": round(percentile(admit_ms, 0.99), 1),
            "max_ms": round(max(admit_ms), 1), "last_tenth_p99_ms": round(percentile(last, 0.99), 1),
            "all_ready_after_s": round(ready_s, 1),
            "leader_cpu_s": round(proc_cpu_s(self.master_pids()[leader]) - cpu_before[leader], 1),
            "watch_events_per_watcher_per_admission": round((watchers.total() - events_before) / (len(admit_ms) + 1), 2),
        }

    def figures_at_rest(self, watchers: Watchers, seconds: float) -> None:
        figures = key_figures(self.store, self.keys)
        epochs = len(records(self.store, self.keys))
        total_keys = sum(f["keys"] for f in figures.values())
        total_bytes = sum(f["bytes"] for f in figures.values())
        takeover = {name: figures.get(name, {"keys": 0, "bytes": 0}) for name in ("assignments", "workers", "drain",
                                                                                   "tenants")}
        self.report["etcd"] = {
            "by_prefix": figures, "epochs": epochs, "keys": total_keys, "bytes": total_bytes,
            "keys_per_epoch": round(total_keys / max(1, epochs), 2),
            "bytes_per_epoch": round(total_bytes / max(1, epochs)),
            "new_leader_reads": {"keys": sum(v["keys"] for v in takeover.values()),
                                 "bytes": sum(v["bytes"] for v in takeover.values()),
                                 "prefixes": sorted(takeover)},
        }
        leader = self.cluster.leader_id() or ""
        pid = self.master_pids()[leader]
        before, events, cpu = etcd_metrics(self.cluster.etcd_endpoint), watchers.total(), proc_cpu_s(pid)
        time.sleep(seconds)
        after = etcd_metrics(self.cluster.etcd_endpoint)
        self.report["at_rest"] = {
            "seconds": seconds, "etcd_per_s": rates(before, after, seconds),
            "watch_events_per_watcher_per_s": round((watchers.total() - events) / seconds, 2),
            "leader_cpu_per_s": round((proc_cpu_s(pid) - cpu) / seconds, 3),
        }

    def failover(self) -> None:
        before = placement(records(self.store, self.keys))
        leader = self.cluster.leader_id() or ""
        self.cpu[f"master {leader} (killed)"] = proc_cpu_s(self.master_pids()[leader])
        client = self.cluster.client(deadline_s=60)
        metrics_before = etcd_metrics(self.cluster.etcd_endpoint)
        killed = time.perf_counter()
        self.cluster.kill_master(leader)
        wait_for(lambda: (self.cluster.leader_id() or leader) != leader, DEADLINE_S, 0.01)
        elected_s = time.perf_counter() - killed
        wait_for(lambda: client.quota(TENANT, memory_quota_bytes=1 << 50), DEADLINE_S, 0.01)
        acting_s = time.perf_counter() - killed
        new = self.cluster.leader_id() or ""
        # The takeover window (worker lease TTL + election TTL + reconnect backoff + reassignment
        # delay) must pass before a move could show; then two more seconds of reconciliation.
        window = 3 * self.args.heartbeat + self.args.ttl + 2.0 + self.args.delay + 2.0
        time.sleep(max(0.0, window - (time.perf_counter() - killed)))
        wait_for(lambda: all_ready(self.store, self.keys, self.datasets, self.replication), DEADLINE_S, 0.5)
        settled_s = time.perf_counter() - killed
        metrics_after = etcd_metrics(self.cluster.etcd_endpoint)
        after = placement(records(self.store, self.keys))
        moved = sum(len(before.get(k, set()) ^ after.get(k, set())) for k in set(before) | set(after))
        self.report["failover"] = {
            "election_ttl_s": self.args.ttl, "killed": leader, "new_leader": new,
            "elected_s": round(elected_s, 2), "acting_s": round(acting_s, 2), "goal_s": self.args.ttl + 1,
            "replicas_moved": moved, "settled_s": round(settled_s, 1),
            "etcd_during": {k: round(metrics_after[k] - metrics_before[k]) for k in metrics_before},
            "new_leader_rss_mb": proc_memory_mb(self.master_pids()[new]),
        }
        self.cluster.start_master(leader)

    def worker_kill(self) -> None:
        assert self.victim is not None
        victim = "v0"
        held = [k for k, r in records(self.store, self.keys).items() if victim in r.replicas]
        self.cpu["agents v0 (killed)"] = proc_cpu_s(self.victim.pid)
        killed = time.perf_counter()
        self.victim.send_signal(signal.SIGKILL)
        self.victim.wait(10)

        def replaced() -> bool:
            found = records(self.store, self.keys)
            return all(victim not in found[k].replicas
                       and sum(r.state == R_READY for r in found[k].replicas.values()) >= self.replication
                       for k in held)

        wait_for(replaced, interval_s=0.2, deadline_s=120)
        lease = 3 * self.args.heartbeat
        self.report["worker_kill"] = {
            "epochs_held": len(held), "ready_elsewhere_s": round(time.perf_counter() - killed, 2),
            "lease_ttl_s": lease, "reassign_delay_s": self.args.delay,
            "goal_s": lease + self.args.delay + 5,
        }

    def finish(self) -> dict:
        for name, pid in self.master_pids().items():
            self.cpu[f"master {name}"] = proc_cpu_s(pid)
            self.report.setdefault("master_memory_mb", {})[name] = proc_memory_mb(pid)
        for index, process in enumerate(self.agents):
            self.cpu[f"agents {index}"] = proc_cpu_s(process.pid)
        if self.cluster.own_etcd is not None and self.cluster.own_etcd.process is not None:
            self.cpu["etcd"] = proc_cpu_s(self.cluster.own_etcd.process.pid)
        self.report["cpu_s"] = {k: round(v, 1) for k, v in self.cpu.items()}
        self.report["cpu_s_total"] = round(sum(self.cpu.values()), 1)
        return self.report

    def stop(self) -> None:
        for process in self.agents + ([self.victim] if self.victim else []):
            if process.poll() is None:
                process.terminate()
        for process in self.agents + ([self.victim] if self.victim else []):
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
        self.cluster.stop()


def run(root: Path, args: argparse.Namespace, workers: int, datasets: int, table: str, *, full: bool) -> dict:
    scale = ScaleRun(root, args, workers, datasets, table)
    watchers = None
    try:
        scale.start()
        watchers = Watchers(scale.cluster.etcd_endpoint, scale.keys, args.watchers)
        scale.admit(watchers)
        scale.figures_at_rest(watchers, args.rest)
        if full:
            scale.failover()
            scale.worker_kill()
        return scale.finish()
    finally:
        if watchers is not None:
            watchers.close()
        scale.stop()


def write_table(path: str) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    write_deltalake(path, pa.table({"id": pa.array(range(10), pa.int64()), "v": pa.array([1.0] * 10)}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=100)
    parser.add_argument("--datasets", type=int, default=2000)
    parser.add_argument("--replication", type=int, default=2)
    parser.add_argument("--masters", type=int, default=3)
    parser.add_argument("--per-process", type=int, default=33, help="simulated workers per agent process")
    parser.add_argument("--watchers", type=int, default=3, help="gateway stand-ins watching etcd")
    parser.add_argument("--ttl", type=int, default=2, help="master election lease TTL, seconds")
    parser.add_argument("--heartbeat", type=int, default=1, help="worker heartbeat interval (lease = 3x), seconds")
    parser.add_argument("--delay", type=float, default=1.0, help="reassignment delay, seconds")
    parser.add_argument("--rest", type=float, default=10.0, help="the idle window, seconds")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--profile", action="store_true",
                        help="py-spy on the leader during the admissions (JSON: leader_profile); its timings are not figures")
    parser.add_argument("--out", default="speedlayer_scale")
    args = parser.parse_args()
    load_start = round(os.getloadavg()[0], 2)
    bench_cpu = time.process_time()
    root = Path(tempfile.mkdtemp(prefix="bench-speedlayer-scale-"))
    table = str(root / "table")
    write_table(table)
    try:
        baseline = None if args.no_baseline else run(root / "baseline", args, 1, 20, table, full=False)
        scale = run(root / "scale", args, args.workers, args.datasets, table, full=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    load_end = round(os.getloadavg()[0], 2)
    adm, fo, wk = scale["admission"], scale["failover"], scale["worker_kill"]
    rss = max(m.get("VmHWM", 0.0) for m in scale["master_memory_mb"].values())
    ratio = (f"{adm['p99_ms'] / baseline['admission']['p99_ms']:.2f}x p99, "
             f"{adm['p50_ms'] / baseline['admission']['p50_ms']:.2f}x p50") if baseline else "-"
    print_table([
        {"case": "admission -> answered", "measured": f"p50 {adm['p50_ms']} ms, p99 {adm['p99_ms']} ms",
         "goal": f"p99 <= {GOAL_ADMIT_P99_MS} ms",
         "baseline": f"1 worker/20: p50 {baseline['admission']['p50_ms']}, p99 {baseline['admission']['p99_ms']} ms"
                     f" ({ratio})" if baseline else "-"},
        {"case": "leader kill -9 -> new leader acting", "measured": f"{fo['acting_s']} s (elected {fo['elected_s']} s)",
         "goal": f"<= TTL+1 = {fo['goal_s']} s", "baseline": f"TTL {fo['election_ttl_s']} s"},
        {"case": "replicas moved by the failover", "measured": fo["replicas_moved"], "goal": "0",
         "baseline": f"{scale['etcd']['epochs']} epochs x {scale['replication']}"},
        {"case": f"worker kill -9 -> its {wk['epochs_held']} epochs READY elsewhere",
         "measured": f"{wk['ready_elsewhere_s']} s", "goal": f"<= {wk['goal_s']} s",
         "baseline": f"lease {wk['lease_ttl_s']} s + delay {wk['reassign_delay_s']} s"},
        {"case": "master RSS (peak, any master)", "measured": f"{rss} MB", "goal": f"<= {GOAL_RSS_MB} MB",
         "baseline": f"1 worker/20: {max(m.get('VmHWM', 0.0) for m in baseline['master_memory_mb'].values())} MB"
                     if baseline else "-"},
        {"case": "etcd per epoch", "measured": f"{scale['etcd']['keys_per_epoch']} keys, "
                                               f"{scale['etcd']['bytes_per_epoch']} B", "goal": "-", "baseline": "-"},
        {"case": "a new leader reads", "measured": f"{scale['etcd']['new_leader_reads']['keys']} keys, "
                                                   f"{scale['etcd']['new_leader_reads']['bytes']:,} B",
         "goal": "-", "baseline": "-"},
        {"case": "watch events / watcher / admission", "measured": adm["watch_events_per_watcher_per_admission"],
         "goal": "-", "baseline": f"at rest {scale['at_rest']['watch_events_per_watcher_per_s']}/s"},
        {"case": "at rest: etcd keep-alives/s, puts/s", "measured":
            f"{scale['at_rest']['etcd_per_s']['keepalives']}, {scale['at_rest']['etcd_per_s']['puts']}",
         "goal": "-", "baseline": f"{args.workers} workers / {args.heartbeat} s heartbeat"},
        {"case": "at rest: leader CPU s/s", "measured": scale["at_rest"]["leader_cpu_per_s"], "goal": "-",
         "baseline": f"1 worker/20: {baseline['at_rest']['leader_cpu_per_s']}" if baseline else "-"},
    ], [Column("case", "case"), Column("measured", "measured"), Column("goal", "goal"),
        Column("baseline (same run)", "baseline")],
        title=f"{args.workers} workers, {args.datasets} datasets, replication {args.replication}, "
              f"{args.masters} masters; load {load_start} -> {load_end}; CPU s {scale['cpu_s_total']}")
    write_results(args.out, {"machine": machine_info(), "load_average_1m_start": load_start,
                             "load_average_1m_end": load_end, "args": vars(args),
                             "bench_process_cpu_s": round(time.process_time() - bench_cpu, 1),
                             "baseline": baseline, "scale": scale})
    return 0


if __name__ == "__main__":
    sys.exit(main())
