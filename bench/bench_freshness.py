"""Freshness: time from a message's publish to its row being visible in Delta, p50 / p99.

Setup: the embedded stack (etcd + our broker subprocess, WAL flushed every 20 ms), orders
published with the official danube-client at a steady rate (default 1,000 msg/s), the orders
pipeline with a processingTime trigger of 500 ms. A watcher thread polls the target's
`_delta_log` every 20 ms and notes when each commit appears; the commit's userMetadata names
the offsets it holds. A row's freshness = the time its commit appeared - its `publish_time`
(both on this machine's clock), for the messages published after a warm-up. Run twice, with and
without the great-expectations suite: the overhead of the expectations step is the ratio of the
mean micro-batch time with / without it. Baseline, same run and same publishing load: Spark's
own `rate` source written to Delta with the same trigger, the floor Spark and Delta set on this
machine (`p50_ratio_vs_spark_rate`). An untimed pipeline phase of 120 s runs first
(`--jit-warmup`): the JVM's JIT compilers keep compiling Spark's and Delta's code for minutes
after the session starts (measured here: 5-7 CPU s per 10 s between 20 and 90 s, 3-4 at 2 min,
under 3 at 3 min; the loaded classes stop growing after a minute, so it is warm-up, not code
generated per batch). With a 10 s warm-up the phases were measured on a JVM at different
stages of that, in their fixed order: the first timed phase (with great-expectations) ran
beside 0.5-0.7 of a core of compilation on two cores, the baseline (last) beside a third of
that.

    python bench/bench_freshness.py [--rate 1000] [--seconds 60] [--warmup 15] [--jit-warmup 120] [--no-profile]
        [--conf KEY=VALUE ...] [--out FILE]

After the timed phases, the with-great-expectations phase runs once more under py-spy
(`bench/pyspy_profile.py`, extra `bench`) on the driver's own Python process, where
foreachBatch runs: the JSON's `driver_profile` lists the hot path's top functions (own and
inclusive samples). That run is not timed.

Prints a table and writes bench/results/freshness.json. Goal on this machine: p50 <= 2 s,
p99 <= 5 s (the Danube lakehouse exporter waits for sealed segments: minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import queue
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from common import tree_cpu_s  # noqa: E402
from danube_core.metadata_etcd import EtcdMetadataStore  # noqa: E402
from danube_core.schema_registry import register_schema  # noqa: E402
from pipelines.config import parse_config  # noqa: E402
from devstack.demo import ORDER_SCHEMA  # noqa: E402
from devstack.broker_stack import EmbeddedStack  # noqa: E402
from pipelines.runner import PipelineRunner  # noqa: E402
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

    def files_visible_at(self) -> dict[str, float]:
        """Data file name -> when the commit that added it appeared."""
        seen = {}
        for version, seen_at in self.seen.items():
            for line in (self.log / f"{version:020d}.json").read_text().splitlines():
                add = json.loads(line).get("add")
                if add:
                    seen[Path(add["path"]).name] = seen_at
        return seen

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


def _publisher_process(service_url: str, topic: str, rate: int, seconds: float, first: int,
                       out: multiprocessing.Queue) -> None:
    out.put(asyncio.run(publish(service_url, topic, rate, seconds, first)))


class Publisher:
    """`publish` in its own process, as a producing application would run: its gRPC calls then
    share the machine's cores with Spark but not the driver's Python interpreter."""

    def __init__(self, service_url: str, topic: str, rate: int, seconds: float, first: int = 0) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._results: multiprocessing.Queue = ctx.Queue()
        self._process = ctx.Process(target=_publisher_process,
                                    args=(service_url, topic, rate, seconds, first, self._results))
        self._limit_s = seconds + 300.0

    def start(self) -> None:
        self._process.start()

    def result(self) -> tuple[int, float]:
        """(sent, achieved rate) once publishing ends; fails at once if the process died."""
        deadline = time.monotonic() + self._limit_s
        while True:
            try:
                found = self._results.get(timeout=1.0)
            except queue.Empty:
                if not self._process.is_alive():
                    raise RuntimeError(f"the publisher exited with code {self._process.exitcode} "
                                       "before reporting") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the publisher did not finish within {self._limit_s:.0f}s") from None
                continue
            self._process.join(60)
            return found


def run_phase(spark, stack: EmbeddedStack, root: Path, label: str, rules: list | None, rate: int, seconds: float,
              warmup_s: float) -> dict:
    """Create the tables on WARMUP messages, then publish at `rate`; measure after `warmup_s`."""
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
        publisher = Publisher(stack.service_url, topic, rate, warmup_s + seconds, warm)
        measure_from = time.time() + warmup_s
        batches_before: list[int] = []  # batches committed during the warm-up
        threading.Timer(warmup_s, lambda: batches_before.append(len(runner.metrics.reports))).start()
        publisher.start()
        sent, achieved = publisher.result()
        wait_for_rows(runner, warm + sent)
    finally:
        runner.stop()
        watcher.stop_event.set()
        watcher.join()
    measured = runner.metrics.reports[batches_before[0]:]
    return summarize(spark, measured, watcher, topic, data["target"]["path"], label, achieved, measure_from)


def run_spark_baseline(spark, stack: EmbeddedStack, root: Path, rate: int, seconds: float, warmup_s: float) -> dict:
    """The floor Spark and Delta set here: Spark's own `rate` source -> Delta, same trigger and load.

    The same publisher runs at the same rate into a topic nobody reads, so the machine carries
    the broker and client load of the Danube phases; only the source and the pipeline's steps
    differ. A row's freshness = when the commit adding its file appeared - its `timestamp`.
    """
    from pyspark.sql import functions as F

    target = root / "spark-rate" / "target"
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "100000")  # keep every batch's progress
    query = (spark.readStream.format("rate").option("rowsPerSecond", rate).load()
             .writeStream.format("delta").option("checkpointLocation", str(root / "spark-rate" / "checkpoint"))
             .trigger(processingTime="500 milliseconds").start(str(target)))
    watcher = CommitWatcher(target)
    watcher.start()
    try:
        publisher = Publisher(stack.service_url, "/default/bench-load", rate, warmup_s + seconds)
        measure_from = time.time() + warmup_s
        publisher.start()
        _, achieved = publisher.result()
        time.sleep(3.0)  # the last rows' batch
    finally:
        query.stop()
        watcher.stop_event.set()
        watcher.join()
    files = watcher.files_visible_at()
    rows = (spark.read.format("delta").load(str(target))
            .select(F.col("timestamp"), F.col("_metadata.file_name").alias("file")).collect())
    measured = [r for r in rows if r["timestamp"].timestamp() >= measure_from]
    latencies = sorted(files[r["file"]] - r["timestamp"].timestamp() for r in measured if r["file"] in files)
    batches = [p for p in query.recentProgress if p.numInputRows
               and _epoch(p.timestamp) >= measure_from]
    return {
        "label": "spark_rate",
        "achieved_rate_msgs_s": round(achieved, 1),
        "rows": len(measured),
        "batches": len(batches),
        "p50_s": round(statistics.median(latencies), 3) if latencies else None,
        "p99_s": round(latencies[int(0.99 * (len(latencies) - 1))], 3) if latencies else None,
        "mean_batch_s": round(statistics.mean(p.durationMs["triggerExecution"] / 1000 for p in batches), 3)
        if batches else None,
        "slowest_batches_s": _slowest([p.durationMs["triggerExecution"] / 1000 for p in batches]),
        "mean_expectations_s": 0.0,
        "mean_batch_rows": round(statistics.mean(p.numInputRows for p in batches)) if batches else None,
    }


def _slowest(durations: list[float], count: int = 5) -> list[float]:
    """The longest batch durations, longest first: the p99 is set by these few batches (Delta
    writes a checkpoint every tenth commit), so they are kept beside the mean."""
    return [round(d, 3) for d in sorted(durations, reverse=True)[:count]]


def with_load(phase, jvm_pid: int) -> dict:
    """Run `phase`; add the CPU seconds the Spark side spent in it (the JVM with its Python
    workers, and this driver process) and the 1-minute load average at its end."""
    cpu_before, wall_before = tree_cpu_s(jvm_pid) + time.process_time(), time.monotonic()
    result = phase()
    result["spark_cpu_s"] = round(tree_cpu_s(jvm_pid) + time.process_time() - cpu_before, 1)
    result["wall_s"] = round(time.monotonic() - wall_before, 1)
    result["load_average_1m"] = round(os.getloadavg()[0], 2)
    return result


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def wait_for_rows(runner: PipelineRunner, rows: int, deadline_s: float = 300.0) -> None:
    deadline = time.monotonic() + deadline_s
    while runner.metrics.totals()["rows"] < rows:
        if time.monotonic() > deadline:
            raise TimeoutError(f"pipeline saw {runner.metrics.totals()['rows']} of {rows} rows in {deadline_s}s")
        time.sleep(0.1)


def summarize(spark, reports: list, watcher: CommitWatcher, topic: str, target: str, label: str,
              achieved: float, measure_from: float) -> dict:
    """Freshness of the rows published from `measure_from` on, and the measured batches' times."""
    spans = watcher.offset_visible_at(topic)
    rows = [row for row in spark.read.format("delta").load(target).select("_offset", "_publish_time").collect()
            if row["_publish_time"].timestamp() >= measure_from]
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
        "slowest_batches_s": _slowest([r.duration_s for r in reports]),
        "slowest_batch_steps": [{"rows": r.rows, **{step: round(t, 3) for step, t in r.timings_s.items()}}
                                for r in sorted(reports, key=lambda r: -r.duration_s)[:5]],
        "mean_expectations_s": round(statistics.mean(r.timings_s.get("expectations", 0.0) for r in reports), 3)
        if reports else None,
        "mean_step_s": {step: round(statistics.mean(r.timings_s.get(step, 0.0) for r in reports), 3)
                        for step in sorted({k for r in reports for k in r.timings_s})},
        "mean_batch_rows": round(statistics.mean(r.rows for r in reports)) if reports else None,
    }


def profile_driver(spark, stack: EmbeddedStack, root: Path, rate: int, seconds: float, warmup_s: float) -> dict | None:
    """py-spy on this (the driver's) Python process during an untimed with-expectations phase."""
    import os

    sys.path.insert(0, str(REPO / "bench"))
    from pyspy_profile import PythonProfile, available

    if not available():
        return None
    with PythonProfile(pids=[os.getpid()], subprocesses=False) as prof:
        run_phase(spark, stack, root, "profiled", RULES, rate, seconds, warmup_s)
    return prof.summary(top=15)


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def _settings(parser: argparse.ArgumentParser, pairs: list[str]) -> dict[str, str]:
    """`--conf KEY=VALUE` arguments as a dict; a pair without `=` is refused naming it."""
    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            parser.error(f"--conf {pair!r}: expected KEY=VALUE")
        settings[key] = value
    return settings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=1000, help="messages per second")
    # 60 s: 35-60 batches a phase, so the p99 rests on several checkpoint batches rather than
    # on whether one fell into a 20 s window (p99 ratios of 20 s runs spread over 1.5-2.5x).
    parser.add_argument("--seconds", type=float, default=60.0, help="measured publishing time per phase")
    parser.add_argument("--warmup", type=float, default=15.0, help="publishing seconds before measuring")
    parser.add_argument("--no-profile", action="store_true", help="skip the py-spy run of the driver")
    parser.add_argument("--jit-warmup", type=float, default=120.0,
                        help="seconds of an untimed pipeline phase first (0: none), so that the first timed "
                             "phase does not alone pay the JVM's and Python's warm-up")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for the session every phase runs in (repeatable)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "freshness.json",
                        help="where to write the JSON report")
    args = parser.parse_args()
    spark_conf = {"spark.ui.enabled": "false", **_settings(parser, args.conf)}
    profile = None
    root = Path(tempfile.mkdtemp(prefix="bench-freshness-"))
    results = []
    with EmbeddedStack(root / "stack") as stack:
        spark = build_session("bench-freshness", conf=spark_conf)
        try:
            if args.jit_warmup > 0:  # untimed: the phases below all start from a warmed-up JVM
                run_phase(spark, stack, root, "jit-warmup", RULES, args.rate, args.jit_warmup, 0.0)
            jvm = spark.sparkContext._gateway.proc.pid
            phases = [lambda rules=rules, label=label: run_phase(spark, stack, root, label, rules, args.rate,
                                                                 args.seconds, args.warmup)
                      for label, rules in (("with_ge", RULES), ("without_ge", None))]
            phases.append(lambda: run_spark_baseline(spark, stack, root, args.rate, args.seconds, args.warmup))
            for phase in phases:
                results.append(with_load(phase, jvm))
            if not args.no_profile:
                profile = profile_driver(spark, stack, root, args.rate, args.seconds, args.warmup)
        finally:
            spark.stop()
    with_ge, without_ge, baseline = results
    ratio = (with_ge["mean_batch_s"] / without_ge["mean_batch_s"]
             if with_ge["mean_batch_s"] and without_ge["mean_batch_s"] else None)
    report = {"rate_target_msgs_s": args.rate, "trigger": "processingTime 500 ms", "spark_conf": spark_conf,
              "jit_warmup_s": args.jit_warmup,
              "phases": results,
              "ge_overhead_ratio": None if ratio is None else round(ratio, 2),
              "p50_ratio_vs_spark_rate": _ratio(without_ge["p50_s"], baseline["p50_s"]),
              "p99_ratio_vs_spark_rate": _ratio(without_ge["p99_s"], baseline["p99_s"]),
              "with_ge_p50_ratio_vs_spark_rate": _ratio(with_ge["p50_s"], baseline["p50_s"]),
              "with_ge_p99_ratio_vs_spark_rate": _ratio(with_ge["p99_s"], baseline["p99_s"]),
              "driver_profile": profile,
              "goal": {"p50_s": 2.0, "p99_s": 5.0}}
    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"{'phase':<12} {'rate/s':>8} {'rows':>7} {'batches':>8} {'p50 s':>7} {'p99 s':>7} "
          f"{'batch s':>8} {'GE s':>6} {'CPU s':>6} {'wall s':>6} {'load':>5}")
    for r in results:
        print(f"{r['label']:<12} {r['achieved_rate_msgs_s']:>8} {r['rows']:>7} {r['batches']:>8} {r['p50_s']!s:>7} "
              f"{r['p99_s']!s:>7} {r['mean_batch_s']!s:>8} {r['mean_expectations_s']!s:>6} "
              f"{r['spark_cpu_s']:>6} {r['wall_s']:>6} {r['load_average_1m']:>5}")
    print(f"great-expectations overhead (mean batch time with / without): {report['ge_overhead_ratio']}")
    print(f"p50 without great-expectations / p50 of Spark's rate source -> Delta: {report['p50_ratio_vs_spark_rate']}")
    print(f"vs Spark's rate source, p50 / p99: without great-expectations {report['p50_ratio_vs_spark_rate']} / "
          f"{report['p99_ratio_vs_spark_rate']}, with {report['with_ge_p50_ratio_vs_spark_rate']} / "
          f"{report['with_ge_p99_ratio_vs_spark_rate']}")
    if profile:
        print(f"driver profile ({profile['samples']} samples), top own: "
              + ", ".join(f"{r['function']} {r['share']:.0%}" for r in profile["own"][:5]))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
