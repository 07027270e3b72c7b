"""A stream's per-trigger planning from the LocalCache against reading etcd on every trigger.

Setup: an etcd of its own; one topic with `--descriptors` object descriptors (default 100,000,
written in transactions), read by a stream from the head (`startingOffsets=latest`,
`walRoot=none`, so planning is metadata only). While the stream runs, a writer thread uploads
a new object (descriptor + `cur`) every `--object-interval-ms`. Each trigger is what Spark asks
of the driver: `latestOffset` then `partitions`, every `--trigger-interval-ms`, `--triggers`
times. The driver's etcd connection is wrapped in a counting proxy.

Two cases, same run, same topic and writer load:
1. without cache (the baseline): the catalog reads etcd on every trigger (as before the cache);
2. with cache: the stream's catalog reads the LocalCache (loaded once, then watched).

Per trigger: planning wall and CPU ms (median, p99), etcd requests and range reads; the
query's start (etcd connection, subscription lock and, with the cache, its one-off load of
every descriptor; `initialOffset`) and the first trigger are reported apart. Ratios are against the baseline.

    python bench/bench_metadata_cache.py [--descriptors 100000] [--triggers 100]

Prints a table and writes bench/results/metadata_cache.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH_DIR.parent), str(BENCH_DIR)]

from bench_connector import put_all, topic_items  # noqa: E402
from common import Column, machine_info, print_table, profile_top, timed, write_results  # noqa: E402
from broker.embedded_etcd import EmbeddedEtcd  # noqa: E402
from danube_core import keys  # noqa: E402
from danube_core.local_cache import LocalCache  # noqa: E402
from danube_core.metadata import EtcdMetadataStore  # noqa: E402
from danube_core.objectstore import object_id_for  # noqa: E402
from danube_core.records import CurPointer, ObjectDescriptor  # noqa: E402
from danube_core.topics import TopicName  # noqa: E402

TOPIC = "/bench/cached"
OBJECT_OFFSETS = 100  # messages per descriptor
PROFILE_TRIGGERS = 20
CASES = ("without cache (etcd per trigger)", "with cache")


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


def write_topic(endpoint: str, count: int) -> float:
    """The topic's keys with `count` descriptors; returns the seconds it took."""
    created = int(time.time())
    with timed() as t:
        items = topic_items(TopicName.parse(TOPIC), [descriptor(k, created) for k in range(count)],
                            count * OBJECT_OFFSETS - 1)
        put_all(endpoint, [(k, v) for k, v in items if not k.endswith("/state")])  # live, not sealed
    return t.wall_s


class Uploader(threading.Thread):
    """Writes the next descriptor and `cur` every `interval_s`, as a broker's uploader does."""

    def __init__(self, endpoint: str, first: int, interval_s: float) -> None:
        super().__init__(daemon=True)
        self.store = EtcdMetadataStore(endpoint)
        self.next, self.interval_s, self.stop_event = first, interval_s, threading.Event()
        self.storage = keys.StorageKeys()

    def run(self) -> None:
        topic, created = TopicName.parse(TOPIC), int(time.time())
        while not self.stop_event.wait(self.interval_s):
            d = descriptor(self.next, created)
            self.store.put(self.storage.object_key(topic, d.start_offset), d.to_json())
            self.store.put(self.storage.cur_key(topic), CurPointer.for_offset(d.start_offset).to_json())
            self.next += 1

    def stop(self) -> None:
        self.stop_event.set()
        self.join()
        self.store.close()


def run_case(endpoint: str, cached: bool, triggers: int, interval_s: float) -> dict:
    """One stream from the head for `triggers` triggers; per-trigger planning and etcd requests."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from connectors import options as options_module
    from connectors.cursor_commit import CursorWriter
    from connectors.stream import DanubeStreamReader

    counters: list[CountingStore] = []
    original, original_start = options_module.EtcdSettings.connect, LocalCache.start
    options_module.EtcdSettings.connect = lambda self: counters.append(CountingStore(original(self))) or counters[-1]
    if not cached:  # the baseline loads no cache: its driver is the one from before the cache
        LocalCache.start = lambda self: self  # type: ignore[method-assign]
    try:
        reader = DanubeStreamReader(options_module.parse_options({
            "etcd.endpoints": endpoint, "storage.url": "memory://bench-metadata-cache", "walRoot": "none",
            "topic": TOPIC, "subscription": f"bench-{uuid.uuid4().hex[:8]}", "startingOffsets": "latest",
        }))
        with timed() as started:  # etcd connection, subscription lock, the cache's first load
            state = reader._driver()
            if not cached:  # the baseline: the same driver planning, and writing its lag, from etcd
                state.catalog = state.etcd_catalog
                state.writer = CursorWriter(state.metadata, state.writer.subscription)
            start = reader.initialOffset()
    finally:
        options_module.EtcdSettings.connect, LocalCache.start = original, original_start
    etcd = counters[0]
    rows, offsets_planned = [], 0
    try:
        for _ in range(triggers):
            requests, range_reads = etcd.requests, etcd.range_reads
            with timed() as t:
                end = reader.latestOffset(start, ReadAllAvailable())
                partitions = reader.partitions(start, end)
            rows.append({"wall_ms": t.wall_s * 1000, "cpu_ms": t.cpu_s * 1000, "tasks": len(partitions),
                         "requests": etcd.requests - requests, "range_reads": etcd.range_reads - range_reads})
            offsets_planned += end["offsets"][TOPIC] - start["offsets"][TOPIC]
            start = end
            time.sleep(interval_s)  # a processingTime trigger
        loaded_keys = len(state.cache.get_prefix(keys.StorageKeys().objects_prefix(TOPIC), keys_only=True)) \
            if cached else None

        def plan_more() -> None:  # untimed triggers under cProfile: the planning hot path
            nonlocal start
            for _ in range(PROFILE_TRIGGERS):
                end = reader.latestOffset(start, ReadAllAvailable())
                reader.partitions(start, end)
                start = end

        profile = profile_top(plan_more, top=12)
    finally:
        reader.stop()
    steady = rows[1:]
    wall = sorted(r["wall_ms"] for r in steady)
    return {
        "case": CASES[cached], "triggers": triggers, "offsets_planned": offsets_planned,
        "query_start_ms": round(started.wall_s * 1000, 1), "first_trigger_ms": round(rows[0]["wall_ms"], 1),
        "median_wall_ms": round(statistics.median(wall), 3), "p99_wall_ms": round(wall[int(0.99 * (len(wall) - 1))], 3),
        "median_cpu_ms": round(statistics.median(r["cpu_ms"] for r in steady), 3),
        "requests_per_trigger": round(sum(r["requests"] for r in steady) / len(steady), 2),
        "range_reads_per_trigger": round(sum(r["range_reads"] for r in steady) / len(steady), 2),
        "range_reads_after_first": sum(r["range_reads"] for r in steady),
        "first_10_median_ms": round(statistics.median(r["wall_ms"] for r in steady[:10]), 3),
        "last_10_median_ms": round(statistics.median(r["wall_ms"] for r in steady[-10:]), 3),
        "descriptors_in_cache_at_end": loaded_keys,
        "profile": {"case": f"{PROFILE_TRIGGERS} more triggers, untimed", "tool": "cProfile", "top_own_time": profile},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--descriptors", type=int, default=100_000)
    parser.add_argument("--triggers", type=int, default=100)
    parser.add_argument("--trigger-interval-ms", type=float, default=50.0)
    parser.add_argument("--object-interval-ms", type=float, default=100.0)
    args = parser.parse_args(argv)

    load_start = round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as work, EmbeddedEtcd(data_dir=f"{work}/etcd") as etcd:
        write_s = write_topic(etcd.endpoint, args.descriptors)
        print(f"wrote {args.descriptors:,} descriptors in {write_s:.1f}s")
        uploader = Uploader(etcd.endpoint, args.descriptors, args.object_interval_ms / 1000)
        uploader.start()
        try:
            results = [run_case(etcd.endpoint, cached, args.triggers, args.trigger_interval_ms / 1000)
                       for cached in (False, True)]
        finally:
            uploader.stop()
        objects_added = uploader.next - args.descriptors
    base = results[0]
    for row in results:
        row["wall_ratio_vs_baseline"] = round(row["median_wall_ms"] / base["median_wall_ms"], 3)
        row["cpu_ratio_vs_baseline"] = round(row["median_cpu_ms"] / base["median_cpu_ms"], 3)
    print_table(results, [
        Column("case", "case"), Column("start ms", "query_start_ms", "{:,.1f}"),
        Column("first ms", "first_trigger_ms", "{:,.1f}"),
        Column("median ms", "median_wall_ms", "{:.2f}"), Column("p99 ms", "p99_wall_ms", "{:.2f}"),
        Column("cpu ms", "median_cpu_ms", "{:.2f}"), Column("x base", "wall_ratio_vs_baseline", "{:.3f}"),
        Column("etcd req/trigger", "requests_per_trigger", "{:.2f}"),
        Column("range reads/trigger", "range_reads_per_trigger", "{:.2f}"),
        Column("first10 ms", "first_10_median_ms", "{:.2f}"), Column("last10 ms", "last_10_median_ms", "{:.2f}"),
    ], title=f"{args.descriptors:,} descriptors, {objects_added} objects added while streaming; "
             f"{args.triggers} triggers per case (steady state excludes the first); load at start {load_start}")
    for row in results:
        print(f"\n{row['case']}: planning hot path ({row['profile']['case']}, own time)")
        for fn in row["profile"]["top_own_time"][:6]:
            print(f"  {fn['share']:>6.1%}  {fn['function']}")
    write_results("metadata_cache", {
        "machine": machine_info(), "load_average_1m_start": load_start, "descriptors": args.descriptors, "write_seconds": round(write_s, 1),
        "objects_added_while_streaming": objects_added, "trigger_interval_ms": args.trigger_interval_ms,
        "object_interval_ms": args.object_interval_ms, "results": results,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
