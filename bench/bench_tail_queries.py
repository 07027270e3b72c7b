"""Queries on an epoch plus its topic's tail against the epoch alone: a point lookup, a group-by
and a `count(*)` through the gateway, with 100 k tail rows held, in the same run on the same data.

Real processes on loopback: etcd and our broker (`devstack.EmbeddedStack`), one master, one worker
(with its tail process) and a Data Gateway (`devstack.EmbeddedSpeedLayer`). No pipeline runs, so
no epoch takes the tail's rows over while it is measured (`devstack.tail_table`): the topic gets
`--head` + `--tail-rows` orders (JSON, the demo's order schema), the first `--head` of them read
and split by the pipeline's own tail feed (the rows the pipeline would write) and repeated to
`--epoch-rows` rows with unique `order_id`s and offsets, written as the pipeline's Delta table
with one commit whose `userMetadata` says it holds offsets [0, head). The dataset is admitted with
its tail, which then reads the `--tail-rows` messages above the epoch; the benchmark waits until
an answer counts all of them.

Each query then runs `--repeat` times with the tail on and `--repeat` times with
`committed_only` (the epoch alone), in alternating blocks (tail, epoch, epoch, tail, ...), each
through one gateway client; per query and mode: p50/p95 of the answer's wall time, and the
worker's process-tree CPU seconds over its blocks (the tail process idles meanwhile: the topic
gets no more messages). Reports the ratio tail/epoch of the p50s (goal, issue 42: <= 1.3 at
100 k tail rows) and the load average.

    python bench/bench_tail_queries.py [--epoch-rows 1000000] [--tail-rows 100000] [--repeat 40]

Writes bench/results/tail_queries.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from common import Column, machine_info, print_table, run_in_workdir, tree_cpu_s, write_results  # noqa: E402

DATASET, TOPIC = "orders", "/default/tail-queries"
GOAL_RATIO = 1.3
QUERIES = {
    "point lookup": "SELECT * FROM orders WHERE order_id = 'e123457'",
    "group-by": "SELECT currency, count(*) AS n, sum(amount) AS total, count(DISTINCT customer) AS customers "
                "FROM orders GROUP BY currency ORDER BY currency",
    "count(*)": "SELECT count(*) AS n FROM orders",
}


def measure(client, worker: int, sql: str, repeat: int, block: int = 10) -> dict:
    """`repeat` answers per mode in alternating blocks; wall times and the worker tree's CPU."""
    times: dict[bool, list[float]] = {False: [], True: []}
    cpu = {False: 0.0, True: 0.0}
    results = {}
    for committed in (False, True):  # warm both paths
        results[committed] = client.query(DATASET, sql, committed_only=committed)
    order_ = [False, True, True, False]
    k = 0
    while min(len(v) for v in times.values()) < repeat:
        committed = order_[k % 4]
        k += 1
        before = tree_cpu_s(worker)
        for _ in range(block):
            started = time.perf_counter()
            client.query(DATASET, sql, committed_only=committed)
            times[committed].append(time.perf_counter() - started)
        cpu[committed] += tree_cpu_s(worker) - before
    out = {}
    for committed, label in ((False, "tail"), (True, "epoch")):
        ts = sorted(times[committed])
        out[label] = {"answers": len(ts), "p50_ms": round(statistics.median(ts) * 1000, 2),
                      "p95_ms": round(ts[int(0.95 * (len(ts) - 1))] * 1000, 2),
                      "worker_cpu_ms_per_answer": round(cpu[committed] * 1000 / len(ts), 2),
                      "rows": results[committed].num_rows}
    return out


def run(work: Path, args: argparse.Namespace) -> dict:
    from danube_core.metadata_etcd import EtcdMetadataStore
    from danube_core.schema_registry import register_schema
    from devstack.broker_stack import EmbeddedStack
    from devstack.demo import ORDER_SCHEMA
    from devstack.speedlayer_stack import EmbeddedSpeedLayer
    from devstack.tail_table import commit_epoch, pipeline_file, produce_orders
    from speedlayer.clients.query_client import QueryClient

    with EmbeddedStack(work / "stack") as stack:
        with EtcdMetadataStore(stack.etcd_endpoint) as metadata:
            register_schema(metadata, DATASET, "JsonSchema", json.dumps(ORDER_SCHEMA))
        started = time.monotonic()
        produced = asyncio.run(produce_orders(stack.service_url, TOPIC, 0, args.head + args.tail_rows))
        produce_s = time.monotonic() - started
        data = pipeline_file(stack.etcd_endpoint, stack.storage_url, work, DATASET, TOPIC)
        commit_epoch(data, args.head, args.epoch_rows)
        layer = EmbeddedSpeedLayer(work / "speedlayer", stack.etcd_endpoint, tenant="acme")
        try:
            layer.start(workers=1)
            layer.admit(DATASET, data["target"]["path"], tail_pipeline=json.dumps(data),
                        tail_limit_rows=max(1_000_000, 2 * args.tail_rows))
            worker = layer.processes["worker-w1"].pid
            with QueryClient(layer.gateway, "acme", client_id="bench-tail-queries") as client:
                deadline, held, state = time.monotonic() + 600, 0, ""
                while held < args.tail_rows and time.monotonic() < deadline:
                    table = client.query(DATASET, QUERIES["count(*)"])
                    tail = json.loads((table.schema.metadata or {}).get(b"speedlayer.tail", b"{}"))
                    held, state = int(tail.get("rows", 0)), str(tail.get("state", ""))
                    time.sleep(0.2)
                if held != args.tail_rows:
                    raise RuntimeError(f"the tail holds {held} rows, not {args.tail_rows}: {state!r} (logs in {work})")
                load = [round(os.getloadavg()[0], 2)]
                cpu_all, wall = tree_cpu_s(), time.monotonic()
                rows = []
                for name, sql in QUERIES.items():
                    got = measure(client, worker, sql, args.repeat)
                    tail, epoch = got["tail"], got["epoch"]
                    rows.append({"query": name, "tail_p50_ms": tail["p50_ms"], "epoch_p50_ms": epoch["p50_ms"],
                                 "ratio_p50": round(tail["p50_ms"] / epoch["p50_ms"], 3),
                                 "tail_p95_ms": tail["p95_ms"], "epoch_p95_ms": epoch["p95_ms"],
                                 "tail_worker_cpu_ms": tail["worker_cpu_ms_per_answer"],
                                 "epoch_worker_cpu_ms": epoch["worker_cpu_ms_per_answer"],
                                 "ratio_cpu": round(tail["worker_cpu_ms_per_answer"]
                                                    / max(epoch["worker_cpu_ms_per_answer"], 1e-9), 3),
                                 "answers": tail["answers"] + epoch["answers"],
                                 "rows_tail_epoch": f"{tail['rows']}/{epoch['rows']}"})
                    load.append(round(os.getloadavg()[0], 2))
                all_cpu_s, wall_s = round(tree_cpu_s() - cpu_all, 1), round(time.monotonic() - wall, 1)
        finally:
            layer.stop()
    goal = [r for r in rows if r["query"] in ("point lookup", "group-by")]
    return {"machine": machine_info(), "epoch_rows": args.epoch_rows, "tail_rows": args.tail_rows,
            "head": args.head, "repeat": args.repeat, "produced": produced, "produce_s": round(produce_s, 1),
            "queries": rows, "load_average_1m": load, "all_cpu_s": all_cpu_s, "wall_s": wall_s,
            "goal_ratio": GOAL_RATIO, "goal_met": all(r["ratio_p50"] <= GOAL_RATIO for r in goal)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epoch-rows", type=int, default=1_000_000, help="rows of the epoch")
    parser.add_argument("--tail-rows", type=int, default=100_000, help="rows the tail holds above the epoch")
    parser.add_argument("--head", type=int, default=1000, help="messages the epoch's commit holds")
    parser.add_argument("--repeat", type=int, default=40, help="answers per query and mode")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args()
    report = run_in_workdir("bench-tail-queries-", lambda work: run(work, args), keep=args.keep)
    print_table(report["queries"], [
        Column("query", "query"), Column("tail p50 ms", "tail_p50_ms"), Column("epoch p50 ms", "epoch_p50_ms"),
        Column("ratio", "ratio_p50"), Column("tail p95 ms", "tail_p95_ms"), Column("epoch p95 ms", "epoch_p95_ms"),
        Column("tail CPU ms", "tail_worker_cpu_ms"), Column("epoch CPU ms", "epoch_worker_cpu_ms"),
        Column("CPU ratio", "ratio_cpu"), Column("rows", "rows_tail_epoch")],
        title=f"epoch {report['epoch_rows']:,} rows + tail {report['tail_rows']:,} rows vs the epoch alone "
              f"(through the gateway)")
    print(f"load (1 min) {report['load_average_1m']}; all CPU {report['all_cpu_s']} s over {report['wall_s']} s; "
          f"produced {report['produced']} in {report['produce_s']} s; goal (<= {GOAL_RATIO}x for point lookup "
          f"and group-by) met: {report['goal_met']}")
    write_results("tail_queries", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
