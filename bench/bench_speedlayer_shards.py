"""Benchmark: a sharded dataset (4 shards on 4 workers, merged at the gateway) vs the same table whole.

Usage: python bench/bench_speedlayer_shards.py [--rows 2000000] [--days 8] [--samples 60]
       [--worker-memory-mb 2048] [--worker-threads 1]

Writes one Delta table partitioned by `day` (deltalake), starts a real etcd and an embedded speed
layer (one master, four workers, one gateway; each a process) and admits the table twice, in
the same run: as `orders_whole` (one copy on one worker: the tenant's shard limit is above its
size) and as `orders_sharded` (the tenant's `shard_max_bytes` then set to a little over a quarter
of its estimate: 4 shards, one per worker). Replication 1 for both, so each query reads each
row once. Then, alternating the two forms query by query so that both see the same load:

* a group-by over the whole table (every shard asked, partial aggregates merged at the gateway);
* a partition-pruned point query (`day = ...` and a customer: one shard asked);
* then (`--gather-samples`, no goal) a shape that does not decompose, `count(DISTINCT customer)`
  and `median(amount)` of a tenth of the rows, gathered from all 4 shards and run at the gateway
  (the tenant's `gather_max_bytes` raised to twice the table's estimate for it), against the
  whole copy. A tenth: each shard then sends about 0.5 M rows, under a worker's default answer
  cap of 1 M rows, which bounds what a gather may fetch from one shard.

Goals (issue 26): sharded group-by p50 <= 1.5x whole, pruned point query p50 <= 1.2x whole, and
the same answers. Reports the load average, CPU seconds of the process tree and wall seconds per
phase, the whole copy's estimate against what one worker may hold (0.8 x --worker-memory-mb: the
run stops if the whole copy would itself be sharded), and each process's peak RSS. Writes
bench/results/speedlayer_shards.json.
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
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "bench"))

from common import Column, Phase, machine_info, print_table, tree_cpu_s, write_results  # noqa: E402

GROUP_GOAL, POINT_GOAL = 1.5, 1.2
TENANT = "bench"
GROUP_SQL = ("SELECT day, count(*) AS orders, sum(amount) AS amount, avg(items) AS items, max(customer) AS last "
             "FROM {dataset} GROUP BY day ORDER BY day")
POINT_SQL = "SELECT count(*) AS orders, sum(amount) AS amount FROM {dataset} WHERE day = '{day}' AND customer = '{customer}'"
GATHER_SQL = ("SELECT count(DISTINCT customer) AS customers, median(amount) AS amount FROM {dataset} "
              "WHERE items = 1 AND amount < 250")


def write_orders(path: str, rows: int, days: int) -> None:
    import numpy as np
    import pyarrow as pa
    from deltalake import write_deltalake

    rng = np.random.default_rng(7)
    ids = np.arange(rows, dtype=np.int64)
    write_deltalake(path, pa.table({
        "order_id": pa.array(ids),
        "day": pa.array([f"2024-01-{d + 1:02d}" for d in range(days)]).take(pa.array(ids % days)),
        "customer": pa.array([f"c-{c:05d}" for c in range(10_000)]).take(pa.array(rng.integers(0, 10_000, rows))),
        "amount": pa.array(np.round(rng.random(rows) * 500, 2)),
        "items": pa.array(rng.integers(1, 6, rows, dtype=np.int32)),
    }), partition_by=["day"])


def p50(samples: list[float]) -> float:
    return round(statistics.median(samples), 2)


def peak_rss_mb(pid: int) -> float:
    """A live process's peak resident memory (VmHWM), MiB; 0 if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return 0.0


def run(rows: int, days: int, samples: int, root: Path, worker_memory_mb: int = 2048, worker_threads: int = 1,
        gather_samples: int = 3) -> dict:
    from danube_core.embedded_etcd import EmbeddedEtcd
    from danube_core.metadata_etcd import EtcdMetadataStore
    from devstack.speedlayer_stack import EmbeddedSpeedLayer
    from speedlayer.clients import QueryClient
    from speedlayer.keys import SpeedLayerKeys
    from speedlayer.records import TenantConfig

    phases: dict = {}
    table = str(root / "orders")
    with Phase("write_table", phases):
        write_orders(table, rows, days)
    etcd = EmbeddedEtcd(str(root / "etcd"))
    layer = EmbeddedSpeedLayer(root / "speedlayer", etcd.endpoint, tenant=TENANT)
    metadata = EtcdMetadataStore(etcd.endpoint)
    keys = SpeedLayerKeys(root="/speedlayer")
    try:
        with Phase("start_admit_whole", phases):
            layer.start(workers=4, worker_memory_mb=worker_memory_mb, worker_threads=worker_threads)
            layer.admit("orders_whole", table, replication=1, timeout_s=600)
            layer.wait_queryable("orders_whole")
        status = layer._client.status(TENANT, "orders_whole").epochs[0]
        estimate = status.estimated_memory_bytes
        one_worker = int(worker_memory_mb * 1024 * 1024 * 0.8)  # master.sharding.WORKER_SHARE
        if status.message.startswith("sharded") or estimate > one_worker:
            raise RuntimeError(f"the whole copy ({estimate} bytes estimated) does not fit one worker ({one_worker} "
                               f"bytes of {worker_memory_mb} MiB): raise --worker-memory-mb")
        metadata.put(keys.tenant_config(TENANT), TenantConfig(shard_max_bytes=int(estimate / 4 * 1.1)).to_json())
        time.sleep(1.0)  # the master's watch of the tenant config
        with Phase("admit_sharded", phases):
            reply = layer._client.admit(_request("orders_sharded", table))
            if reply.status not in ("ASSIGNED", "PLANNED"):
                raise RuntimeError(f"admission of the sharded form refused: {reply.status} {reply.message}")
            layer.wait_queryable("orders_sharded", timeout_s=600)
        shards = [e for e in layer._client.status(TENANT, "orders_sharded").epochs if e.kind == "shard"]
        placement = {e.epoch_id: [r.worker_id for r in e.replicas if r.state == "READY"] for e in shards}
        rng = random.Random(3)
        timings: dict[str, list[float]] = {f"{q}_{f}": [] for q in ("group", "point") for f in ("whole", "sharded")}
        with Phase("queries", phases), QueryClient(layer.gateway, TENANT, client_id="bench") as client:
            for sql in (GROUP_SQL, POINT_SQL):  # warm both forms, and check they agree
                answers = [client.query(d, sql.format(dataset=d, day="2024-01-02", customer="c-00042")).to_pylist()
                           for d in ("orders_whole", "orders_sharded")]
                assert _same(*answers), (sql, answers)
            for i in range(samples * 3):
                kind = "group" if i % 3 == 0 else "point"
                day, customer = f"2024-01-{rng.randrange(days) + 1:02d}", f"c-{rng.randrange(10_000):05d}"
                for form in (("whole", "sharded") if i % 2 else ("sharded", "whole")):
                    sql = (GROUP_SQL if kind == "group" else POINT_SQL).format(
                        dataset=f"orders_{form}", day=day, customer=customer)
                    started = time.perf_counter()
                    client.query(f"orders_{form}", sql)
                    timings[f"{kind}_{form}"].append((time.perf_counter() - started) * 1000)
        metadata.put(keys.tenant_config(TENANT), TenantConfig(shard_max_bytes=int(estimate / 4 * 1.1),
                                                              gather_max_bytes=2 * estimate).to_json())
        time.sleep(1.0)  # the gateway's watch of the tenant config
        timings.update(gather_whole=[], gather_sharded=[])
        note = ""
        with Phase("gather_queries", phases), QueryClient(layer.gateway, TENANT, client_id="bench") as client:
            try:
                for i in range(gather_samples):
                    answers = []
                    for form in (("whole", "sharded") if i % 2 else ("sharded", "whole")):
                        started = time.perf_counter()
                        answer = client.query(f"orders_{form}", GATHER_SQL.format(dataset=f"orders_{form}"))
                        timings[f"gather_{form}"].append((time.perf_counter() - started) * 1000)
                        answers.append(answer.to_pylist())
                        note = (answer.schema.metadata or {}).get(b"speedlayer.note", b"").decode() or note
                    if not _same(*answers) or not note.startswith("gathered 4 of 4 shards"):
                        raise RuntimeError(f"not gathered, or another answer: {answers} ({note!r})")
            except Exception as exc:  # reported with the figures measured before it
                note = f"gather failed: {exc!r}"
                timings.update(gather_whole=[], gather_sharded=[])
        peak_rss = {"bench": peak_rss_mb(os.getpid()),
                    **{name: peak_rss_mb(process.pid) for name, process in layer.processes.items()}}
    finally:
        metadata.close()
        layer.stop()
        etcd.stop()
    medians = {k: p50(v) for k, v in timings.items() if v}
    return {"rows": rows, "days": days, "estimated_memory_bytes": estimate, "one_worker_bytes": one_worker,
            "worker_memory_mb": worker_memory_mb, "worker_threads": worker_threads, "peak_rss_mb": peak_rss,
            "whole_on": [r.worker_id for r in status.replicas if r.state == "READY"], "shards": placement,
            "p50_ms": medians, "samples": {k: len(v) for k, v in timings.items()},
            "ratio_group": round(medians["group_sharded"] / medians["group_whole"], 2),
            "ratio_point": round(medians["point_sharded"] / medians["point_whole"], 2),
            "ratio_gather": round(medians["gather_sharded"] / medians["gather_whole"], 2)
            if timings["gather_sharded"] else None, "gather_note": note, "phases": phases}


def _request(dataset: str, table: str):
    from speedlayer.clients import delta_request

    return delta_request(TENANT, dataset, table, replication=1)


def _same(left: list[dict], right: list[dict]) -> bool:
    def rounded(rows: list[dict]) -> list[dict]:
        return [{k: round(v, 6) if isinstance(v, float) else v for k, v in row.items()} for row in rows]
    return rounded(left) == rounded(right)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--days", type=int, default=8)
    parser.add_argument("--samples", type=int, default=60, help="group-by samples per form (point: twice as many)")
    parser.add_argument("--worker-memory-mb", type=int, default=2048,
                        help="each worker's memory: 0.8x of it must hold the whole copy")
    parser.add_argument("--worker-threads", type=int, default=1, help="DuckDB threads per worker")
    parser.add_argument("--gather-samples", type=int, default=3, help="gathered count DISTINCT/median samples per form")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-speedlayer-shards-"))
    load_start = round(os.getloadavg()[0], 2)
    cpu0, wall0 = tree_cpu_s(), time.perf_counter()
    try:
        report = run(args.rows, args.days, args.samples, root, args.worker_memory_mb, args.worker_threads,
                     args.gather_samples)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report.update(machine=machine_info(), cpu_s=round(tree_cpu_s() - cpu0, 1), load_1m_start=load_start,
                  wall_s=round(time.perf_counter() - wall0, 1), load_1m_end=round(os.getloadavg()[0], 2))
    medians = report["p50_ms"]
    rows = [{"query": q, "whole": medians[f"{q}_whole"], "sharded": medians[f"{q}_sharded"],
             "ratio": report[f"ratio_{q}"], "goal": goal, "met": report[f"ratio_{q}"] <= goal}
            for q, goal in (("group", GROUP_GOAL), ("point", POINT_GOAL))]
    print_table(rows, [Column("query", "query"), Column("whole p50 ms", "whole"), Column("4 shards p50 ms", "sharded"),
                       Column("sharded/whole", "ratio"), Column("goal <=", "goal"), Column("met", "met")],
                title=f"{args.rows} rows, {args.days} days; load {load_start} -> {report['load_1m_end']}, "
                      f"{report['cpu_s']} CPU s, {report['wall_s']} s wall")
    if report["ratio_gather"] is not None:
        print(f"count(DISTINCT)/median gathered from 4 shards: p50 {medians['gather_sharded']} ms, whole "
              f"{medians['gather_whole']} ms ({report['ratio_gather']}x; no goal)")
    print(report["gather_note"])
    report["goals_met"] = all(r["met"] for r in rows)
    write_results("speedlayer_shards", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
