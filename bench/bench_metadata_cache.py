"""A stream's metadata costs against the size of the cluster around it.

Why one module of ~530 lines: a benchmark is read as one script, from the etcd it fills to the
tables it prints, its S3 and `--spark` cases included; what benchmarks share is `bench/common.py`.

What a `readStream.format("danube")` query's driver pays before its first batch and on every
trigger must follow the topic it reads, not the cluster: how many other topics etcd holds, how
long the topic's history is. Each case runs what Spark's streaming-source process runs for a
query (the `DanubeStreamReader` driver: etcd connection, subscription lock, metadata cache,
`initialOffset`, then `latestOffset` + `partitions` per trigger) in a fresh Python process of
its own, so its start, CPU and memory are its alone (`--repeat` runs per case, medians
reported); its etcd connection is wrapped in a counting proxy.

Setup, one etcd (descriptors written straight into it, in transactions of 128 puts):

1. `/bench/stream`, `--descriptors` (10,000) descriptors, alone in etcd: the baseline;
2. the same stream with 99, then 999 other topics of `--other-descriptors` (10,000) each
   beside it (`--topics 1,100,1000`);
3. resuming near the head (a cursor `--behind` (5) descriptors below it): on `/bench/stream`
   (the baseline), and on `/bench/long`, a topic of `--long-descriptors` (1,000,000);
4. from `earliest` on the same two topics: a stream far behind plans a window of its backlog
   (`PLAN_WINDOW_OBJECTS` objects) per trigger; "window ms" is the median planning time of the
   triggers that planned a whole window, which must not grow with the history;
5. resuming near the head of topics whose objects are in S3 (a moto server), `--s3-objects`
   (100 and 10,000) of them: the S3 listings its start makes (counted from moto's request log,
   per run) must not follow the object count.

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
import logging
import os
import resource
import statistics
import subprocess
import sys
import re
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Callable, Iterator

BENCH_DIR = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH_DIR.parent), str(BENCH_DIR)]

from bench_connector import put_all  # noqa: E402
from common import Column, machine_info, print_table, rss_mb, timed, write_results  # noqa: E402
from connectors.query_scope import PLAN_WINDOW_OBJECTS  # noqa: E402
from danube_core import keys  # noqa: E402
from danube_core.embedded_etcd import EmbeddedEtcd  # noqa: E402
from danube_core.metadata_etcd import EtcdMetadataStore  # noqa: E402
from danube_core.objectstore import OBJECTS_PATH_TEMPLATE, object_id_for  # noqa: E402
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
    """Writes the next descriptor and `cur` of one topic every `interval_s`, as an uploader does
    (and its object first, through `write_object`, when the case's objects are stored)."""

    def __init__(self, endpoint: str, topic: str, first: int, interval_s: float,
                 write_object: Callable[[ObjectDescriptor], None] | None = None) -> None:
        super().__init__(daemon=True)
        self.store = EtcdMetadataStore(endpoint)
        self.topic, self.next, self.interval_s = TopicName.parse(topic), first, interval_s
        self.write_object = write_object
        self.stop_event = threading.Event()

    def run(self) -> None:
        storage, created = keys.StorageKeys(), int(time.time())
        while not self.stop_event.wait(self.interval_s):
            d = descriptor(self.next, created)
            if self.write_object is not None:
                self.write_object(d)
            self.store.put(storage.object_key(self.topic, d.start_offset), d.to_json())
            self.store.put(storage.cur_key(self.topic), CurPointer.for_offset(d.start_offset).to_json())
            self.next += 1

    def stop(self) -> None:
        self.stop_event.set()
        self.join()
        self.store.close()


# ---- one case, in a process of its own --------------------------------------------------------


def run_case(spec: dict) -> dict:
    """The stream driver of one query: start, then `triggers` triggers. Runs in the child."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from connectors import options as options_module
    from connectors.stream import DanubeStreamReader

    counters: list[CountingStore] = []
    original = options_module.EtcdSettings.connect
    options_module.EtcdSettings.connect = lambda self: counters.append(CountingStore(original(self))) or counters[-1]
    reader = DanubeStreamReader(options_module.parse_options({
        "etcd.endpoints": spec["endpoint"], "storage.url": spec.get("storage_url", "memory://bench-metadata-cache"),
        "storage.options": json.dumps(spec.get("storage_options", {})), "walRoot": "none",
        "topic": spec["topic"], "subscription": spec["subscription"], "startingOffsets": spec["starting"],
    }))
    rss_before = rss_mb()
    with timed() as started:  # what a query does before its first batch: start -> first progress
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
        reader.partitions(start, end)
    rss_started = rss_mb()
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
                         "range_reads": etcd.range_reads - range_reads,
                         "offsets": sum(end["offsets"].values()) - sum(start["offsets"].values())})
            start = end
            time.sleep(spec["trigger_interval_s"])
        cached_keys = len(state.scope.cache._values)
    finally:
        reader.stop()
    steady = rows[1:]
    wall = sorted(r["wall_ms"] for r in steady)
    # Triggers that planned a whole window of a backlog (a stream far behind), if any.
    windows = [r for r in rows if r["offsets"] >= PLAN_WINDOW_OBJECTS * OBJECT_OFFSETS]
    return {
        "window_triggers": len(windows),
        "window_wall_ms": round(statistics.median(r["wall_ms"] for r in windows), 1) if windows else 0,
        "window_cpu_ms": round(statistics.median(r["cpu_ms"] for r in windows), 1) if windows else 0,
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
            uploads_from: int, args: argparse.Namespace, storage: dict | None = None,
            write_object: Callable[[ObjectDescriptor], None] | None = None) -> dict:
    """One case, `--repeat` times, each in a child process while its topic receives uploads;
    every figure is the median of the repeats (the machine is shared). `storage`: the
    `storage_url` and `storage_options` of the topic's objects (default: an empty memory store)."""
    runs, first = [], uploads_from
    for _ in range(args.repeat):
        spec = {"endpoint": endpoint, "topic": topic, "subscription": subscription, "starting": starting,
                "triggers": args.triggers, "trigger_interval_s": args.trigger_interval_ms / 1000, **(storage or {})}
        uploader = Uploader(endpoint, topic, uploads_from, args.object_interval_ms / 1000, write_object)
        uploader.start()
        try:
            done = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True,
                                  text=True, timeout=1800)
        finally:
            uploader.stop()
        if done.returncode != 0:
            raise RuntimeError(f"case {case!r} failed:\n{done.stderr[-4000:]}")
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        uploads_from = uploader.next
    row = {key: statistics.median(run[key] for run in runs) for key, value in runs[0].items()
           if isinstance(value, (int, float))}
    row.update(case=case, group=group, objects_added=uploads_from - first,
               start_wall_ms_runs=[run["start_wall_ms"] for run in runs])
    print(f"  {case}: start {row['start_wall_ms']:,.0f} ms (runs {row['start_wall_ms_runs']}), "
          f"rss +{row['rss_growth_mb']} MB, {row['range_reads_per_trigger']} range reads/trigger", flush=True)
    return row


# ---- a topic's objects on S3 (--s3-objects) ----------------------------------------------------


class ListRequests(logging.Handler):
    """Counts the S3 object listings (ListObjectsV2) a moto server answers, from its request log."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += "list-type=2" in record.getMessage()


def s3_listing_cases(endpoint: str, counts: list[int], args: argparse.Namespace) -> list[dict]:
    """A stream resuming `--behind` descriptors below the head of a topic whose `count`
    descriptors each have their object in S3: its start lists only the objects near its offsets
    (`object_id_ranges`), so its listings must not follow the topic's object count."""
    import boto3
    import fsspec
    from moto.server import ThreadedMotoServer

    from danube_core.ports import free_port, wait_for_port

    port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=True)
    moto.start()
    wait_for_port(port)
    counter = ListRequests()
    logging.getLogger("werkzeug").addHandler(counter)
    logging.getLogger("werkzeug").setLevel(logging.INFO)
    options = {"key": "bench", "secret": "bench",
               "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}", "region_name": "us-east-1"}}
    boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id="bench",
                 aws_secret_access_key="bench", region_name="us-east-1").create_bucket(Bucket="bench-objects")
    fs = fsspec.filesystem("s3", **options)
    rows = []
    try:
        for count in counts:
            topic = f"/bench/s3-{count}"
            created = int(time.time())
            write_topics(endpoint, [topic], count)
            directory = "bench-objects/" + OBJECTS_PATH_TEMPLATE.format(ns="bench", topic=topic.rsplit("/", 1)[1])
            with timed() as wrote:
                fs.pipe({f"{directory}/{descriptor(k, created).object_id}": b"-" for k in range(count)})
            print(f"wrote {count:,} objects to S3 in {wrote.wall_s:.0f}s", flush=True)
            subscription = resume_near_head(endpoint, topic, count - 1, args.behind)
            before = counter.count
            rows.append(measure(endpoint, f"resume {args.behind} behind head, {count:,} objects on S3", "objects on S3",
                                topic, starting="cursor", subscription=subscription, uploads_from=count, args=args,
                                storage={"storage_url": "s3://bench-objects", "storage_options": options},
                                write_object=lambda d, at=directory: fs.pipe_file(f"{at}/{d.object_id}", b"-")))
            rows[-1]["s3_list_requests"] = (counter.count - before) / args.repeat
    finally:
        logging.getLogger("werkzeug").removeHandler(counter)
        moto.stop()
    return rows


# ---- the same stream as a real Spark query (--spark) ------------------------------------------

RANGE_STARTED = re.compile(
    r'^grpc_server_started_total\{grpc_method="Range",grpc_service="etcdserverpb.KV",[^}]*\} (\d+)$', re.M)
SOURCE_RUNNER = "python_streaming_source_runner"


def etcd_range_calls(endpoint: str) -> int:
    """Range RPCs the etcd server has started (its own metrics: every client counted)."""
    text = urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10).read().decode()
    match = RANGE_STARTED.search(text)
    return int(match.group(1)) if match else 0


def source_runners() -> dict[int, float]:
    """pid -> RSS (MB) of the Python processes Spark runs streaming sources' driver side in."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    if SOURCE_RUNNER.encode() in cmdline.read():
                        found[int(entry)] = rss_mb(int(entry))
            except OSError:
                continue
    return found


def spark_case(spark, endpoint: str, case: str, group: str, topic: str, *, uploads_from: int,
               args: argparse.Namespace) -> dict:
    """`readStream.format("danube")` on `topic` from latest into the noop sink: start() -> first
    progress, the source process's and the JVM's RSS, etcd range calls per trigger while objects
    arrive (the etcd server's count; the query commits cursors from its source process)."""
    jvm_pid = int(spark.sparkContext._jvm.ProcessHandle.current().pid())
    runners_before = set(source_runners())
    jvm_before = rss_mb(jvm_pid)
    uploader = Uploader(endpoint, topic, uploads_from, args.object_interval_ms / 1000)
    df = (spark.readStream.format("danube").option("etcd.endpoints", endpoint)
          .option("storage.url", "memory://bench-metadata-cache").option("walRoot", "none")
          .option("topic", topic).option("subscription", f"spark-{uuid.uuid4().hex[:8]}")
          .option("startingOffsets", "latest")
          .option("failOnDataLoss", "false")  # its objects are descriptors only: nothing to read
          .load())
    with timed() as started:
        query = df.writeStream.format("noop").trigger(processingTime=f"{args.spark_trigger_ms} milliseconds").start()
        while not query.recentProgress:
            if query.exception() is not None:
                raise RuntimeError(f"case {case!r}: {query.exception()}")
            time.sleep(0.02)
    try:
        runner = {pid: mb for pid, mb in source_runners().items() if pid not in runners_before}
        uploader.start()
        time.sleep(args.spark_trigger_ms / 1000 * 3)  # the first triggers, before counting
        batches, ranges = len(query.recentProgress), etcd_range_calls(endpoint)
        time.sleep(args.spark_seconds)
        triggers = len(query.recentProgress) - batches
        range_calls = etcd_range_calls(endpoint) - ranges
        runner_rss = max(runner.values(), default=float("nan"))
    finally:
        uploader.stop()
        query.stop()
    row = {"case": case, "group": group, "start_wall_ms": round(started.wall_s * 1000, 1),
           "source_process_rss_mb": round(runner_rss, 1), "jvm_rss_growth_mb": round(rss_mb(jvm_pid) - jvm_before, 1),
           "triggers": triggers, "range_calls_per_trigger": round(range_calls / triggers, 3) if triggers else None,
           "objects_added": uploader.next - uploads_from}
    print(f"  spark {case}: first progress {row['start_wall_ms']:,.0f} ms, source process {row['source_process_rss_mb']} MB, "
          f"{row['range_calls_per_trigger']} range calls/trigger", flush=True)
    return row


def spark_session():
    from pyspark.sql import SparkSession

    return (SparkSession.builder.master("local[2]").appName("bench-metadata-cache")
            .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2").getOrCreate())


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
    parser.add_argument("--repeat", type=int, default=3, help="runs per case (figures are their medians)")
    parser.add_argument("--trigger-interval-ms", type=float, default=50.0)
    parser.add_argument("--object-interval-ms", type=float, default=100.0)
    parser.add_argument("--s3-objects", default="100,10000",
                        help="objects in S3 (moto) of the topics a stream resumes near the head of, the first "
                             "the baseline; empty: no S3 cases")
    parser.add_argument("--spark", action="store_true",
                        help="also run each cluster size as a real Spark query (start -> first progress, RSS)")
    parser.add_argument("--spark-trigger-ms", type=int, default=500)
    parser.add_argument("--spark-seconds", type=float, default=15.0, help="measured time per Spark query")
    args = parser.parse_args(argv)
    if args.child:
        return child_main(args.child)
    sizes = [int(n) for n in args.topics.split(",")]

    load_start = round(os.getloadavg()[0], 2)
    results: list[dict] = []
    spark_rows: list[dict] = []
    writes: dict[str, float] = {}
    spark = spark_session() if args.spark else None
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
            if spark is not None:
                if not spark_rows:  # a first query warms the JVM up; its figures are not kept
                    head += spark_case(spark, etcd.endpoint, "warm-up", "", STREAM_TOPIC, uploads_from=head,
                                       args=args)["objects_added"]
                spark_rows.append(spark_case(spark, etcd.endpoint, f"from latest, {size:,} topic(s)", "cluster size",
                                             STREAM_TOPIC, uploads_from=head, args=args))
                head += spark_rows[-1]["objects_added"]
        writes["long"] = write_topics(etcd.endpoint, [LONG_TOPIC], args.long_descriptors)
        print(f"wrote {args.long_descriptors:,} descriptors of {LONG_TOPIC} in {writes['long']:.0f}s", flush=True)
        heads = {STREAM_TOPIC: head, LONG_TOPIC: args.long_descriptors}  # next descriptor of each
        names = {STREAM_TOPIC: f"{args.descriptors:,}", LONG_TOPIC: f"{args.long_descriptors:,}"}
        for topic in heads:
            subscription = resume_near_head(etcd.endpoint, topic, heads[topic] - 1, args.behind)
            results.append(measure(etcd.endpoint, f"resume {args.behind} behind head, {names[topic]} descriptors",
                                   "history length", topic, starting="cursor", subscription=subscription,
                                   uploads_from=heads[topic], args=args))
            heads[topic] += results[-1]["objects_added"]
        for topic in heads:
            results.append(measure(etcd.endpoint, f"from earliest, {names[topic]} descriptors", "from earliest",
                                   topic, starting="earliest", subscription=f"earliest-{uuid.uuid4().hex[:8]}",
                                   uploads_from=heads[topic], args=args))
            heads[topic] += results[-1]["objects_added"]
        if args.s3_objects:
            results += s3_listing_cases(etcd.endpoint, [int(n) for n in args.s3_objects.split(",")], args)
    for group in ("cluster size", "history length", "from earliest", "objects on S3"):
        rows = [r for r in results if r["group"] == group]
        if not rows:
            continue
        base = rows[0]
        for row in rows:
            for key in ("start_wall_ms", "start_cpu_ms", "rss_growth_mb", "median_wall_ms", "window_wall_ms"):
                row[f"{key}_ratio"] = round(row[key] / base[key], 3) if base[key] else None
    print_table(results, [
        Column("case", "case"), Column("start ms", "start_wall_ms", "{:,.1f}"),
        Column("x", "start_wall_ms_ratio", "{:.2f}"), Column("start cpu ms", "start_cpu_ms", "{:,.1f}"),
        Column("x", "start_cpu_ms_ratio", "{:.2f}"), Column("rss +MB", "rss_growth_mb", "{:.1f}"),
        Column("x", "rss_growth_mb_ratio", "{:.2f}"), Column("cached keys", "cached_keys", "{:,}"),
        Column("trigger ms", "median_wall_ms", "{:.2f}"), Column("p99 ms", "p99_wall_ms", "{:.2f}"),
        Column("cpu ms", "median_cpu_ms", "{:.2f}"),
        Column("range reads/trigger", "range_reads_per_trigger", "{:.2f}"),
        Column("window triggers", "window_triggers", "{:.0f}"), Column("window ms", "window_wall_ms", "{:.1f}"),
        Column("x", "window_wall_ms_ratio", "{:.2f}"), Column("window cpu ms", "window_cpu_ms", "{:.1f}"),
        Column("S3 list requests", "s3_list_requests", "{:.0f}"),
    ], title=f"one stream's metadata costs; {args.triggers} triggers per case while objects arrive every "
             f"{args.object_interval_ms:.0f} ms; load at start {load_start}, at end {os.getloadavg()[0]:.2f}")
    if spark_rows:
        base = spark_rows[0]
        for row in spark_rows:
            for key in ("start_wall_ms", "source_process_rss_mb"):
                row[f"{key}_ratio"] = round(row[key] / base[key], 3) if base[key] else None
        print_table(spark_rows, [
            Column("case", "case"), Column("first progress ms", "start_wall_ms", "{:,.0f}"),
            Column("x", "start_wall_ms_ratio", "{:.2f}"), Column("source process MB", "source_process_rss_mb", "{:.1f}"),
            Column("x", "source_process_rss_mb_ratio", "{:.2f}"), Column("JVM +MB", "jvm_rss_growth_mb", "{:.1f}"),
            Column("triggers", "triggers"), Column("etcd range calls/trigger", "range_calls_per_trigger", "{:.2f}"),
        ], title=f"the same stream as a real Spark query (local[2], noop sink, {args.spark_trigger_ms} ms trigger, "
                 f"{args.spark_seconds:.0f} s measured; range calls counted by the etcd server)")
        spark.stop()
    write_results("metadata_cache", {
        "machine": machine_info(), "load_average_1m_start": load_start,
        "load_average_1m_end": round(os.getloadavg()[0], 2), "arguments": vars(args),
        "write_seconds": {k: round(v, 1) for k, v in writes.items()}, "results": results,
        "spark": spark_rows,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
