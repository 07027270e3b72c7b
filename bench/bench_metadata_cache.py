"""A stream's metadata costs against the size of the cluster around it.

What a `readStream.format("danube")` query's driver pays before its first batch and on every
trigger must follow the topic it reads, not the cluster: how many other topics etcd holds, how
long the topic's history is. Each case runs what Spark's streaming-source process runs for a
query (the `DanubeStreamReader` driver: etcd connection, subscription lock, metadata cache,
`initialOffset`, then `latestOffset` + `partitions` per trigger) in a fresh Python process of
its own, so its start, CPU and memory are its alone; its etcd connection is wrapped in a
counting proxy.

Setup, one etcd (descriptors written straight into it, in transactions of 128 puts):

1. `/bench/stream`, `--descriptors` (10,000) descriptors, alone in etcd: the baseline;
2. the same stream with 99, then 999 other topics of `--other-descriptors` (10,000) each
   beside it (`--topics 1,100,1000`);
3. resuming near the head (a cursor `--behind` (5) descriptors below it): on `/bench/stream`
   (the baseline), and on `/bench/long`, a topic of `--long-descriptors` (1,000,000).

While a case runs its triggers, a writer uploads a new object (descriptor + `cur`) to its
topic every `--object-interval-ms`, as a broker's uploader does. Per case: start -> first
batch planned (wall and CPU ms), the process's RSS growth over its imports (MB), keys in its
cache, then per trigger (steady state, the first excluded): planning wall and CPU ms (median,
p99) and etcd range reads. Ratios are against the baseline of the same group, in the same run.

    python bench/bench_metadata_cache.py [--topics 1,100,1000] [--other-descriptors 10000]

Prints a table and writes bench/results/metadata_cache.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator

BENCH_DIR = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH_DIR.parent), str(BENCH_DIR)]

from bench_connector import put_all  # noqa: E402
from common import Column, machine_info, print_table, timed, write_results  # noqa: E402
from broker.embedded_etcd import EmbeddedEtcd  # noqa: E402
from danube_core import keys  # noqa: E402
from danube_core.metadata import EtcdMetadataStore  # noqa: E402
from danube_core.objectstore import object_id_for  # noqa: E402
from danube_core.records import CurPointer, ObjectDescriptor, Policies, dump_cursor  # noqa: E402
from danube_core.topics import TopicName  # noqa: E402

STREAM_TOPIC = "/bench/stream"
LONG_TOPIC = "/bench/long"
OBJECT_OFFSETS = 100  # messages per descriptor
NULL_JSON = b"null"
# 11 M descriptors of ~300 bytes: more than etcd's default 2 GiB backend quota.
ETCD_FLAGS = ("--quota-backend-bytes", str(16 * 1024**3), "--unsafe-no-fsync")


class CountingStore:
    """The driver's etcd connection, counting requests (range reads apart)."""

    RANGE_READS = ("get", "get_prefix", "get_range", "range_at")

    def __init__(self, store: EtcdMetadataStore) -> None:
        self._store = store
        self.requests = self.range_reads = 0

    def __getattr__(self, name: str):
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr

        def counted(*args, **kwargs):
            self.requests += 1
            self.range_reads += name in self.RANGE_READS
            return attr(*args, **kwargs)

        return counted


def descriptor(k: int, created: int) -> ObjectDescriptor:
    start = k * OBJECT_OFFSETS
    return ObjectDescriptor(object_id_for(start, created + k), start, start + OBJECT_OFFSETS - 1,
                            OBJECT_OFFSETS * 200, None, created + k, True, [(start, 0)])


def topic_keys(topic: TopicName, count: int, created: int) -> Iterator[tuple[str, bytes]]:
    """A live (unsealed) topic's keys with `count` descriptors: index entry, descriptors, `cur`."""
    storage = keys.StorageKeys()
    yield keys.namespace_topic_key(topic), NULL_JSON
    for k in range(count):
        d = descriptor(k, created)
        yield storage.object_key(topic, d.start_offset), d.to_json()
    yield storage.cur_key(topic), CurPointer.for_offset((count - 1) * OBJECT_OFFSETS).to_json()


def write_topics(endpoint: str, names: list[str], count: int) -> float:
    """Write `names` with `count` descriptors each; returns the seconds it took."""
    created = int(time.time())
    with timed() as t:
        put_all(endpoint, (kv for name in names for kv in topic_keys(TopicName.parse(name), count, created)))
    return t.wall_s


class Uploader(threading.Thread):
    """Writes the next descriptor and `cur` of one topic every `interval_s`, as an uploader does."""

    def __init__(self, endpoint: str, topic: str, first: int, interval_s: float) -> None:
        super().__init__(daemon=True)
        self.store = EtcdMetadataStore(endpoint)
        self.topic, self.next, self.interval_s = TopicName.parse(topic), first, interval_s
        self.stop_event = threading.Event()

    def run(self) -> None:
        storage, created = keys.StorageKeys(), int(time.time())
        while not self.stop_event.wait(self.interval_s):
            d = descriptor(self.next, created)
            self.store.put(storage.object_key(self.topic, d.start_offset), d.to_json())
            self.store.put(storage.cur_key(self.topic), CurPointer.for_offset(d.start_offset).to_json())
            self.next += 1

    def stop(self) -> None:
        self.stop_event.set()
        self.join()
        self.store.close()


# ---- one case, in a process of its own --------------------------------------------------------


def vm_rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def run_case(spec: dict) -> dict:
    """The stream driver of one query: start, then `triggers` triggers. Runs in the child."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from connectors import options as options_module
    from connectors.stream import DanubeStreamReader

    counters: list[CountingStore] = []
    original = options_module.EtcdSettings.connect
    options_module.EtcdSettings.connect = lambda self: counters.append(CountingStore(original(self))) or counters[-1]
    reader = DanubeStreamReader(options_module.parse_options({
        "etcd.endpoints": spec["endpoint"], "storage.url": "memory://bench-metadata-cache", "walRoot": "none",
        "topic": spec["topic"], "subscription": spec["subscription"], "startingOffsets": spec["starting"],
    }))
    rss_before = vm_rss_mb()
    with timed() as started:  # what a query does before its first batch: start -> first progress
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
        reader.partitions(start, end)
    rss_started = vm_rss_mb()
    state = reader._state
    assert state is not None
    etcd, rows = counters[0], []
    start = end
    try:
        for _ in range(spec["triggers"]):
            range_reads = etcd.range_reads
            with timed() as t:
                end = reader.latestOffset(start, ReadAllAvailable())
                reader.partitions(start, end)
            rows.append({"wall_ms": t.wall_s * 1000, "cpu_ms": t.cpu_s * 1000,
                         "range_reads": etcd.range_reads - range_reads})
            start = end
            time.sleep(spec["trigger_interval_s"])
        cached_keys = len(state.scope.cache._values)
    finally:
        reader.stop()
    steady = rows[1:]
    wall = sorted(r["wall_ms"] for r in steady)
    return {
        "start_wall_ms": round(started.wall_s * 1000, 1), "start_cpu_ms": round(started.cpu_s * 1000, 1),
        "rss_growth_mb": round(rss_started - rss_before, 1),
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "cached_keys": cached_keys,
        "median_wall_ms": round(statistics.median(wall), 3), "p99_wall_ms": round(wall[int(0.99 * (len(wall) - 1))], 3),
        "median_cpu_ms": round(statistics.median(r["cpu_ms"] for r in steady), 3),
        "range_reads_per_trigger": round(sum(r["range_reads"] for r in steady) / len(steady), 3),
        "offsets_at_end": end["offsets"],
    }


def child_main(spec_json: str) -> int:
    import pyspark.sql.datasource  # noqa: F401  # imports first: RSS growth is the query's own
    import connectors.stream  # noqa: F401

    print(json.dumps(run_case(json.loads(spec_json))))
    return 0


def measure(endpoint: str, case: str, group: str, topic: str, *, starting: str, subscription: str,
            uploads_from: int, args: argparse.Namespace) -> dict:
    """One case in a child process, its topic receiving uploads meanwhile."""
    spec = {"endpoint": endpoint, "topic": topic, "subscription": subscription, "starting": starting,
            "triggers": args.triggers, "trigger_interval_s": args.trigger_interval_ms / 1000}
    uploader = Uploader(endpoint, topic, uploads_from, args.object_interval_ms / 1000)
    uploader.start()
    try:
        done = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True,
                              text=True, timeout=1800)
    finally:
        uploader.stop()
    if done.returncode != 0:
        raise RuntimeError(f"case {case!r} failed:\n{done.stderr[-4000:]}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    row.update(case=case, group=group, objects_added=uploader.next - uploads_from)
    print(f"  {case}: start {row['start_wall_ms']:,.0f} ms, rss +{row['rss_growth_mb']} MB, "
          f"{row['range_reads_per_trigger']} range reads/trigger", flush=True)
    return row


def resume_near_head(endpoint: str, topic: str, head_descriptor: int, behind: int) -> str:
    """A subscription whose cursor is `behind` descriptors below the topic's head descriptor."""
    subscription = f"resume-{uuid.uuid4().hex[:8]}"
    cursor = (head_descriptor - behind) * OBJECT_OFFSETS - 1
    store = EtcdMetadataStore(endpoint)
    try:
        store.put(keys.cursor_key(TopicName.parse(topic), subscription), dump_cursor(cursor))
    finally:
        store.close()
    return subscription


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--topics", default="1,100,1000", help="cluster sizes in topics, the first the baseline")
    parser.add_argument("--descriptors", type=int, default=10_000, help="descriptors of the stream's topic")
    parser.add_argument("--other-descriptors", type=int, default=10_000, help="descriptors of every other topic")
    parser.add_argument("--long-descriptors", type=int, default=1_000_000)
    parser.add_argument("--behind", type=int, default=5, help="descriptors a resuming cursor is behind the head")
    parser.add_argument("--triggers", type=int, default=60)
    parser.add_argument("--trigger-interval-ms", type=float, default=50.0)
    parser.add_argument("--object-interval-ms", type=float, default=100.0)
    args = parser.parse_args(argv)
    if args.child:
        return child_main(args.child)
    sizes = [int(n) for n in args.topics.split(",")]

    load_start = round(os.getloadavg()[0], 2)
    results: list[dict] = []
    writes: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as work, \
            EmbeddedEtcd(data_dir=f"{work}/etcd", extra_flags=ETCD_FLAGS) as etcd:
        put_all(etcd.endpoint, [(keys.namespace_policy_key("bench"), Policies().to_json())])
        writes["stream"] = write_topics(etcd.endpoint, [STREAM_TOPIC], args.descriptors)
        head = args.descriptors  # next descriptor index of the stream's topic
        written_others = 0
        for size in sizes:
            others = [f"/bench/other-{i:05d}" for i in range(written_others, size - 1)]
            if others:
                writes[f"others to {size}"] = write_topics(etcd.endpoint, others, args.other_descriptors)
                print(f"wrote {len(others):,} topics of {args.other_descriptors:,} descriptors in "
                      f"{writes[f'others to {size}']:.0f}s", flush=True)
            written_others = max(written_others, size - 1)
            row = measure(etcd.endpoint, f"from latest, {size:,} topic(s)", "cluster size", STREAM_TOPIC,
                          starting="latest", subscription=f"latest-{uuid.uuid4().hex[:8]}", uploads_from=head,
                          args=args)
            head += row["objects_added"]
            results.append(row)
        writes["long"] = write_topics(etcd.endpoint, [LONG_TOPIC], args.long_descriptors)
        print(f"wrote {args.long_descriptors:,} descriptors of {LONG_TOPIC} in {writes['long']:.0f}s", flush=True)
        for topic, count, name in ((STREAM_TOPIC, head, f"{args.descriptors:,}"),
                                   (LONG_TOPIC, args.long_descriptors, f"{args.long_descriptors:,}")):
            subscription = resume_near_head(etcd.endpoint, topic, count - 1, args.behind)
            results.append(measure(etcd.endpoint, f"resume {args.behind} behind head, {name} descriptors",
                                   "history length", topic, starting="cursor", subscription=subscription,
                                   uploads_from=count, args=args))
    for group in ("cluster size", "history length"):
        rows = [r for r in results if r["group"] == group]
        base = rows[0]
        for row in rows:
            for key in ("start_wall_ms", "start_cpu_ms", "rss_growth_mb", "median_wall_ms"):
                row[f"{key}_ratio"] = round(row[key] / base[key], 3) if base[key] else None
    print_table(results, [
        Column("case", "case"), Column("start ms", "start_wall_ms", "{:,.1f}"),
        Column("x", "start_wall_ms_ratio", "{:.2f}"), Column("start cpu ms", "start_cpu_ms", "{:,.1f}"),
        Column("x", "start_cpu_ms_ratio", "{:.2f}"), Column("rss +MB", "rss_growth_mb", "{:.1f}"),
        Column("x", "rss_growth_mb_ratio", "{:.2f}"), Column("cached keys", "cached_keys", "{:,}"),
        Column("trigger ms", "median_wall_ms", "{:.2f}"), Column("p99 ms", "p99_wall_ms", "{:.2f}"),
        Column("cpu ms", "median_cpu_ms", "{:.2f}"),
        Column("range reads/trigger", "range_reads_per_trigger", "{:.2f}"),
    ], title=f"one stream's metadata costs; {args.triggers} triggers per case while objects arrive every "
             f"{args.object_interval_ms:.0f} ms; load at start {load_start}, at end {os.getloadavg()[0]:.2f}")
    write_results("metadata_cache", {
        "machine": machine_info(), "load_average_1m_start": load_start,
        "load_average_1m_end": round(os.getloadavg()[0], 2), "arguments": vars(args),
        "write_seconds": {k: round(v, 1) for k, v in writes.items()}, "results": results,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
