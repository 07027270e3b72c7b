"""Publish -> SQL: from a producer's ack to the first gateway answer that counts the message, with a
dataset's topic tail on against today's path (tail off), in the same run.

Real processes on loopback: etcd and our broker (`devstack.EmbeddedStack`, WAL flushed every 20 ms),
one master, one worker and a Data Gateway (`devstack.EmbeddedSpeedLayer`); the orders pipeline
(JSON from the registry, three great-expectations rules, processingTime 500 ms, announcing each
commit to the dataset) in this process's Spark. A publisher process sends valid orders at
`--rate` msg/s to a one-partition topic (up to 64 sends in flight) and notes each ack's wall time;
this process asks the gateway `SELECT count(*)` in a loop. Every answer is a prefix of the topic's
offsets (the property tests/integration/test_tail_handover.py checks), so an answer of n rows counts
offsets 0..n-1; the offsets are mapped to the messages from the Delta table at the end. A
message's latency = the time of the first answer counting it - its ack time (negative when the
tail read it from the WAL before the ack reached the producer).

Phases, on one pipeline and one dataset: `tail_off` (the dataset admitted as today: each Delta
commit becomes an epoch), then the same dataset admitted again with its tail (`--tail-pipeline`),
`tail_on`. Each publishes for `--warmup` + `--seconds` and measures the messages acked after the
warm-up. Reports p50/p95/p99, answers per second, CPU seconds of the worker's process tree (its
tail process included) and of this whole tree, the load average, and tail_on/tail_off ratios.
Goal (issue 42): tail on, p50 <= 300 ms and p99 <= 1 s at 1,000 msg/s.

    python bench/bench_tail.py [--rate 1000] [--seconds 30] [--warmup 10]

Writes bench/results/tail.json.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import multiprocessing
import os
import queue
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from common import Column, machine_info, print_table, run_in_workdir, tree_cpu_s, write_results  # noqa: E402

from devstack.pipeline_process import tail_process  # noqa: E402

DATASET, TOPIC = "orders", "/default/tail-bench"
MAX_IN_FLIGHT = 64
GOAL_P50_S, GOAL_P99_S = 0.3, 1.0
RULES = [
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "order_id"}},
    {"type": "expect_column_values_to_be_between", "kwargs": {"column": "amount", "min_value": 0, "max_value": 100000}},
    {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "currency", "value_set": ["EUR", "USD", "GBP"]}},
]


async def publish(url: str, first: int, count: int, rate: float) -> list[tuple[int, float]]:
    """Send orders first..first+count-1 at `rate`; (order index, ack wall time) per acked send."""
    from danube import DanubeClientBuilder, DispatchStrategy

    client = await DanubeClientBuilder().service_url(url).build()
    producer = (client.new_producer().with_topic(TOPIC).with_name(f"bench-tail-{first}")
                .with_dispatch_strategy(DispatchStrategy.RELIABLE).build())
    await producer.create()
    in_flight = asyncio.Semaphore(MAX_IN_FLIGHT)
    acks: list[tuple[int, float]] = []

    async def send(i: int) -> None:
        try:
            await producer.send(json.dumps({"order_id": f"o{i}", "amount": 1.5, "currency": "EUR"}).encode())
            acks.append((i, time.time()))
        finally:
            in_flight.release()

    started, tasks = time.monotonic(), []
    for n in range(count):
        await asyncio.sleep(max(0.0, started + n / rate - time.monotonic()))
        await in_flight.acquire()
        tasks.append(asyncio.create_task(send(first + n)))
    await asyncio.gather(*tasks)
    await producer.close()
    return acks


def _publisher(url: str, first: int, count: int, rate: float, out: multiprocessing.Queue) -> None:
    out.put(asyncio.run(publish(url, first, count, rate)))


class Publisher:
    """`publish` in a process of its own, as a producing application would run."""

    def __init__(self, url: str, first: int, count: int, rate: float) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._out: multiprocessing.Queue = ctx.Queue()
        self._process = ctx.Process(target=_publisher, args=(url, first, count, rate, self._out))
        self._limit_s = count / rate + 300

    def start(self) -> "Publisher":
        self._process.start()
        return self

    def result(self) -> list[tuple[int, float]]:
        deadline = time.monotonic() + self._limit_s
        while True:
            try:
                acks = self._out.get(timeout=1.0)
                self._process.join(30)
                return acks
            except queue.Empty:
                if not self._process.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"publisher gone (exit code {self._process.exitcode})") from None


class Asker(threading.Thread):
    """`SELECT count(*)` through the gateway in a loop: (answer wall time, rows, tail rows) each,
    and the tail's state in the last answer."""

    def __init__(self, gateway: str) -> None:
        super().__init__(daemon=True)
        self.gateway = gateway
        self.answers: list[tuple[float, int, int]] = []
        self.state = ""
        self.stop_event = threading.Event()

    def run(self) -> None:
        from speedlayer.clients.query_client import QueryClient

        with QueryClient(self.gateway, "acme", client_id="bench-tail") as client:
            while not self.stop_event.is_set():
                table = client.query(DATASET, f"SELECT count(*) AS n FROM {DATASET}")
                tail = json.loads((table.schema.metadata or {}).get(b"speedlayer.tail", b"{}"))
                self.state = str(tail.get("state", ""))
                self.answers.append((time.time(), int(table.column("n")[0].as_py()), int(tail.get("rows", 0))))


def pipeline_file(stack, work: Path) -> dict:
    return {
        "name": DATASET,
        "source": {"etcd_endpoints": stack.etcd_endpoint, "storage_url": stack.storage_url, "topics": [TOPIC],
                   "subscription": "bench-tail", "starting_offsets": "earliest"},
        "decode": {"format": "json", "subject": DATASET},
        "expectations": {"suite": DATASET, "rules": RULES},
        "target": {"path": str(work / "delta" / DATASET)},
        "quarantine": {"path": str(work / "delta" / f"{DATASET}_quarantine")},
        "checkpoint": str(work / "delta" / "_checkpoints" / DATASET),
        "trigger": {"mode": "processingTime", "interval": "500 ms"},
        "speedlayer": {"tenant": "acme", "dataset": DATASET, "etcd_endpoints": stack.etcd_endpoint,
                       "key_root": "/speedlayer"},
    }


def measure(label: str, stack, layer, first: int, args: argparse.Namespace) -> dict:
    """One phase: publish `warmup + seconds` at the rate while asking; what it measured, raw."""
    worker = layer.processes["worker-w1"].pid
    tail = tail_process(worker)
    count = int(args.rate * (args.warmup + args.seconds))
    asker = Asker(layer.gateway)
    cpu_tail = tree_cpu_s(tail) if tail else 0.0
    cpu_worker, cpu_all, wall = tree_cpu_s(worker), tree_cpu_s(), time.monotonic()
    asker.start()
    acks = Publisher(stack.service_url, first, count, args.rate).start().result()
    deadline = time.monotonic() + 120
    while (not asker.answers or asker.answers[-1][1] < first + count) and time.monotonic() < deadline:
        time.sleep(0.05)
    asker.stop_event.set()
    asker.join()
    measured_from = min(t for _, t in acks) + args.warmup
    return {"label": label, "first": first, "count": count, "acks": acks, "answers": asker.answers,
            "measured_from": measured_from, "worker_cpu_s": round(tree_cpu_s(worker) - cpu_worker, 1),
            "tail_process_cpu_s": round(tree_cpu_s(tail) - cpu_tail, 1) if tail else 0.0,
            "all_cpu_s": round(tree_cpu_s() - cpu_all, 1), "wall_s": round(time.monotonic() - wall, 1),
            "load_average_1m": round(os.getloadavg()[0], 2),
            "achieved_rate_msgs_s": round(len(acks) / (max(t for _, t in acks) - min(t for _, t in acks)), 1)}


def latencies(phase: dict, offset_of: dict[int, int]) -> list[float]:
    """Per message acked after the warm-up: first answer counting its offset - its ack."""
    times = [t for t, _, _ in phase["answers"]]
    counts, best = [], 0
    for _, n, _ in phase["answers"]:
        best = max(best, n)
        counts.append(best)
    found = []
    for i, acked_at in phase["acks"]:
        if acked_at < phase["measured_from"] or i not in offset_of:
            continue
        k = bisect.bisect_right(counts, offset_of[i])  # first answer with more rows than the offset
        if k < len(times):
            found.append(times[k] - acked_at)
    return sorted(found)


def pct(values: list[float], q: float) -> float | None:
    return round(values[min(len(values) - 1, round(q * (len(values) - 1)))], 3) if values else None


def run(work: Path, args: argparse.Namespace) -> dict:
    from danube_core.metadata_etcd import EtcdMetadataStore
    from danube_core.schema_registry import register_schema
    from deltalake import DeltaTable
    from devstack.broker_stack import EmbeddedStack
    from devstack.demo import ORDER_SCHEMA
    from devstack.speedlayer_stack import EmbeddedSpeedLayer
    from pipelines.config import parse_config
    from pipelines.runner import PipelineRunner
    from pipelines.session import build_session

    with EmbeddedStack(work / "stack") as stack:
        with EtcdMetadataStore(stack.etcd_endpoint) as metadata:
            register_schema(metadata, DATASET, "JsonSchema", json.dumps(ORDER_SCHEMA))
        data = pipeline_file(stack, work)
        warm = asyncio.run(publish(stack.service_url, 0, 200, 200))
        spark = build_session("bench-tail", conf={"spark.ui.enabled": "false"}, master="local[2]")
        runner = PipelineRunner(parse_config(data, "<bench_tail>"), spark)
        layer = EmbeddedSpeedLayer(work / "speedlayer", stack.etcd_endpoint, tenant="acme")
        phases = []
        try:
            runner.start()
            layer.start(workers=1)
            while not (Path(data["target"]["path"]) / "_delta_log" / f"{0:020d}.json").exists():
                time.sleep(0.1)
            layer.admit(DATASET, data["target"]["path"])
            layer.wait_queryable(DATASET, timeout_s=60)
            first = len(warm)
            phases.append(measure("tail_off", stack, layer, first, args))
            first += phases[-1]["count"]
            layer.admit(DATASET, data["target"]["path"], tail_pipeline=json.dumps(data))
            trickle = Publisher(stack.service_url, first, int(args.rate * 5), args.rate).start()  # next epochs: tail on
            asker = Asker(layer.gateway)
            asker.start()
            first += len(trickle.result())
            deadline = time.monotonic() + 600  # the tail process starts a JVM: minutes on a loaded machine
            while asker.state != "following" and time.monotonic() < deadline:
                time.sleep(0.2)
            asker.stop_event.set()
            asker.join()
            if asker.state != "following":
                raise RuntimeError(f"the tail did not start following: {asker.state!r} (logs in {work})")
            phases.append(measure("tail_on", stack, layer, first, args))
            total = first + phases[-1]["count"]
            deadline = time.monotonic() + 120
            while runner.metrics.totals()["rows"] < total and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            runner.stop()
            layer.stop()
            spark.stop()
        table = DeltaTable(data["target"]["path"]).to_pyarrow_table(columns=["_offset", "order_id"])
        offset_of = {int(o[1:]): off for off, o in zip(table["_offset"].to_pylist(), table["order_id"].to_pylist())}
    rows = []
    for phase in phases:
        found = latencies(phase, offset_of)
        span = max(t for t, _, _ in phase["answers"]) - min(t for t, _, _ in phase["answers"])
        rows.append({"label": phase["label"], "achieved_rate_msgs_s": phase["achieved_rate_msgs_s"],
                     "messages": len(found), "p50_s": pct(found, 0.5), "p95_s": pct(found, 0.95),
                     "p99_s": pct(found, 0.99), "mean_s": round(statistics.mean(found), 3) if found else None,
                     "answers_per_s": round(len(phase["answers"]) / span, 1) if span else None,
                     "answers_with_tail_rows": sum(1 for *_, tail in phase["answers"] if tail),
                     "worker_cpu_s": phase["worker_cpu_s"], "tail_process_cpu_s": phase["tail_process_cpu_s"],
                     "all_cpu_s": phase["all_cpu_s"],
                     "wall_s": phase["wall_s"], "load_average_1m": phase["load_average_1m"]})
    off, on = rows
    # The tail's CPU: its process's, per second of the phase and per 1,000 msg/s achieved (the
    # follower thread inside the worker is in the worker's figures, with the answers it serves).
    per_s = on["tail_process_cpu_s"] / max(on["wall_s"], 1e-9)
    extra_worker = on["worker_cpu_s"] / max(on["wall_s"], 1e-9) - off["worker_cpu_s"] / max(off["wall_s"], 1e-9)
    return {"machine": machine_info(), "rate_target_msgs_s": args.rate, "seconds": args.seconds,
            "warmup_s": args.warmup, "phases": rows,
            "p50_ratio_on_vs_off": round(on["p50_s"] / off["p50_s"], 3) if on["p50_s"] and off["p50_s"] else None,
            "p99_ratio_on_vs_off": round(on["p99_s"] / off["p99_s"], 3) if on["p99_s"] and off["p99_s"] else None,
            "tail_cpu_cores_per_1000_msgs_s": round(per_s * 1000 / max(on["achieved_rate_msgs_s"], 1e-9), 3),
            "worker_tree_extra_cores_on_vs_off": round(extra_worker, 3),
            "goal": {"p50_s": GOAL_P50_S, "p99_s": GOAL_P99_S},
            "goal_met": bool(on["p50_s"] is not None and on["p50_s"] <= GOAL_P50_S and on["p99_s"] <= GOAL_P99_S)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="messages per second")
    parser.add_argument("--seconds", type=float, default=30.0, help="measured publishing time per phase")
    parser.add_argument("--warmup", type=float, default=10.0, help="publishing seconds before measuring, per phase")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args()
    report = run_in_workdir("bench-tail-", lambda work: run(work, args), keep=args.keep)
    print_table(report["phases"], [
        Column("phase", "label"), Column("rate/s", "achieved_rate_msgs_s"), Column("msgs", "messages"),
        Column("p50 s", "p50_s"), Column("p95 s", "p95_s"), Column("p99 s", "p99_s"),
        Column("answers/s", "answers_per_s"), Column("w/ tail", "answers_with_tail_rows"),
        Column("worker CPU s", "worker_cpu_s"), Column("tail proc CPU s", "tail_process_cpu_s"),
        Column("all CPU s", "all_cpu_s"), Column("wall s", "wall_s"),
        Column("load", "load_average_1m")], title="publish ack -> first gateway answer counting the message")
    print(f"tail on / off: p50 {report['p50_ratio_on_vs_off']}, p99 {report['p99_ratio_on_vs_off']}; "
          f"tail process CPU per 1,000 msg/s: {report['tail_cpu_cores_per_1000_msgs_s']} core(s); worker tree "
          f"{report['worker_tree_extra_cores_on_vs_off']} core(s) more with the tail on; goal met: {report['goal_met']}")
    write_results("tail", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
