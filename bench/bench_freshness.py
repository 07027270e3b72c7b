"""Freshness: time from a message's publish to its row being visible in Delta, p50 / p99.

Setup: the embedded stack (etcd + our broker subprocess, WAL flushed every 20 ms), orders
published with the official danube-client at a steady rate (default 1,000 msg/s), the orders
pipeline with a processingTime trigger of 500 ms. A watcher thread polls the target's
`_delta_log` every 20 ms and notes when each commit appears; the commit's userMetadata names
the offsets it holds. A row's freshness = the time its commit appeared - its `publish_time`
(both on this machine's clock), for the messages published after a warm-up. Run twice, with and without the great-expectations suite: the
overhead of the expectations step is the ratio of the mean micro-batch time with / without it.

    python bench/bench_freshness.py [--rate 1000] [--seconds 20]

Prints a table and writes bench/results/freshness.json. Goal on this machine: p50 <= 2 s,
p99 <= 5 s (the Danube lakehouse exporter waits for sealed segments: minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from danube_core.metadata import EtcdMetadataStore  # noqa: E402
from pipelines.config import parse_config  # noqa: E402
from pipelines.demo import ORDER_SCHEMA  # noqa: E402
from pipelines.embedded import EmbeddedStack  # noqa: E402
from pipelines.runner import PipelineRunner  # noqa: E402
from pipelines.schema_registry import register_schema  # noqa: E402
from pipelines.session import build_session  # noqa: E402

WARMUP = 200  # messages processed before measuring (first batches pay JIT and GE start-up)
MAX_IN_FLIGHT = 256
RULES = [
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "order_id"}},
    {"type": "expect_column_values_to_be_between", "kwargs": {"column": "amount", "min_value": 0}},
    {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "currency", "value_set": ["EUR", "USD"]}},
]


class CommitWatcher(threading.Thread):
    """Notes the wall-clock time at which each Delta commit of a table first appears."""

    def __init__(self, table: Path, interval_s: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.log = table / "_delta_log"
        self.interval_s = interval_s
        self.seen: dict[int, float] = {}
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(self.interval_s):
            if self.log.exists():
                now = time.time()
                for path in self.log.glob("*.json"):
                    self.seen.setdefault(int(path.stem), now)

    def offset_visible_at(self, topic: str) -> list[tuple[int, int, float]]:
        """(start, end, seen_at) per commit, from each commit's userMetadata offsets."""
        spans = []
        for version, seen_at in sorted(self.seen.items()):
            for line in (self.log / f"{version:020d}.json").read_text().splitlines():
                info = json.loads(line).get("commitInfo")
                if info and info.get("userMetadata"):
                    span = json.loads(info["userMetadata"])["offsets"].get(topic)
                    if span:
                        spans.append((span["start"], span["end"], seen_at))
        return spans


async def publish(service_url: str, topic: str, rate: int, seconds: float, first: int = 0) -> tuple[int, float]:
    """Send `rate` msg/s for `seconds` (at most MAX_IN_FLIGHT unanswered); returns (sent, achieved rate).

    Sends are scheduled on the clock, not after the previous answer, so a slow broker shows up
    as a lower achieved rate (reported) rather than a silently stretched schedule.
    """
    from danube import DanubeClientBuilder, DispatchStrategy

    client = await DanubeClientBuilder().service_url(service_url).build()
    producer = (client.new_producer().with_topic(topic).with_name(f"bench-{first}")
                .with_dispatch_strategy(DispatchStrategy.RELIABLE).build())
    await producer.create()
    in_flight = asyncio.Semaphore(MAX_IN_FLIGHT)
    tasks: list[asyncio.Task] = []

    async def send(n: int) -> None:
        try:
            await producer.send(json.dumps({"order_id": f"o{n}", "amount": 1.5, "currency": "EUR"}).encode())
        finally:
            in_flight.release()

    started = time.monotonic()
    try:
        for n in range(int(rate * seconds)):
            await asyncio.sleep(max(0.0, started + n / rate - time.monotonic()))
            await in_flight.acquire()
            tasks.append(asyncio.create_task(send(first + n)))
        await asyncio.gather(*tasks)
    finally:
        await producer.close()
    return len(tasks), len(tasks) / (time.monotonic() - started)


def run_phase(spark, stack: EmbeddedStack, root: Path, label: str, rules: list | None, rate: int, seconds: float) -> dict:
    """Warm the pipeline up on WARMUP messages, then measure while publishing at `rate`."""
    topic, name = f"/default/bench-{label}", f"bench-{label}"
    with EtcdMetadataStore(stack.etcd_endpoint) as metadata:
        register_schema(metadata, name, "JsonSchema", json.dumps(ORDER_SCHEMA))
    data = {
        "name": name,
        "source": {"etcd_endpoints": stack.etcd_endpoint, "storage_url": stack.storage_url, "topics": [topic],
                   "subscription": name, "starting_offsets": "earliest"},
        "decode": {"format": "json", "subject": name},
        "target": {"path": str(root / name / "target")},
        "quarantine": {"path": str(root / name / "quarantine")},
        "checkpoint": str(root / name / "checkpoint"),
        "trigger": {"mode": "processingTime", "interval": "500 ms"},
    }
    if rules:
        data["expectations"] = {"suite": name, "rules": rules}
    warm, _ = asyncio.run(publish(stack.service_url, topic, 200, WARMUP / 200))
    runner = PipelineRunner(parse_config(data, f"<{name}>"), spark)
    watcher = CommitWatcher(root / name / "target")
    watcher.start()
    runner.start()
    try:
        wait_for_rows(runner, warm)
        warm_batches = len(runner.metrics.reports)
        sent, achieved = asyncio.run(publish(stack.service_url, topic, rate, seconds, first=warm))
        wait_for_rows(runner, warm + sent)
    finally:
        runner.stop()
        watcher.stop_event.set()
        watcher.join()
    return summarize(spark, runner.metrics.reports[warm_batches:], watcher, topic, data["target"]["path"], label,
                     achieved, warm)


def wait_for_rows(runner: PipelineRunner, rows: int, deadline_s: float = 300.0) -> None:
    deadline = time.monotonic() + deadline_s
    while runner.metrics.totals()["rows"] < rows:
        if time.monotonic() > deadline:
            raise TimeoutError(f"pipeline saw {runner.metrics.totals()['rows']} of {rows} rows in {deadline_s}s")
        time.sleep(0.1)


def summarize(spark, reports: list, watcher: CommitWatcher, topic: str, target: str, label: str,
              achieved: float, first_offset: int) -> dict:
    """Freshness of the measured rows (offsets from `first_offset`) and the measured batches' times."""
    spans = watcher.offset_visible_at(topic)
    rows = (spark.read.format("delta").load(target).filter(f"_offset >= {first_offset}")
            .select("_offset", "_publish_time").collect())
    latencies = []
    for row in rows:
        seen = next((at for start, end, at in spans if start <= row["_offset"] < end), None)
        if seen is not None:
            latencies.append(seen - row["_publish_time"].timestamp())
    latencies.sort()
    return {
        "label": label,
        "achieved_rate_msgs_s": round(achieved, 1),
        "rows": len(rows),
        "batches": len(reports),
        "p50_s": round(statistics.median(latencies), 3) if latencies else None,
        "p99_s": round(latencies[int(0.99 * (len(latencies) - 1))], 3) if latencies else None,
        "mean_batch_s": round(statistics.mean(r.duration_s for r in reports), 3) if reports else None,
        "mean_expectations_s": round(statistics.mean(r.timings_s.get("expectations", 0.0) for r in reports), 3)
        if reports else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=1000, help="messages per second")
    parser.add_argument("--seconds", type=float, default=20.0, help="publishing time per phase")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-freshness-"))
    results = []
    with EmbeddedStack(root / "stack") as stack:
        spark = build_session("bench-freshness", conf={"spark.ui.enabled": "false"})
        try:
            for label, rules in (("with_ge", RULES), ("without_ge", None)):
                results.append(run_phase(spark, stack, root, label, rules, args.rate, args.seconds))
        finally:
            spark.stop()
    with_ge, without_ge = results
    ratio = (with_ge["mean_batch_s"] / without_ge["mean_batch_s"]
             if with_ge["mean_batch_s"] and without_ge["mean_batch_s"] else None)
    report = {"rate_target_msgs_s": args.rate, "trigger": "processingTime 500 ms", "phases": results,
              "ge_overhead_ratio": None if ratio is None else round(ratio, 2),
              "goal": {"p50_s": 2.0, "p99_s": 5.0}}
    out = REPO / "bench" / "results" / "freshness.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"{'phase':<12} {'rate/s':>8} {'rows':>7} {'batches':>8} {'p50 s':>7} {'p99 s':>7} {'batch s':>8} {'GE s':>6}")
    for r in results:
        print(f"{r['label']:<12} {r['achieved_rate_msgs_s']:>8} {r['rows']:>7} {r['batches']:>8} {r['p50_s']!s:>7} "
              f"{r['p99_s']!s:>7} {r['mean_batch_s']!s:>8} {r['mean_expectations_s']!s:>6}")
    print(f"great-expectations overhead (mean batch time with / without): {report['ge_overhead_ratio']}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
