"""`format("danube")` -> Delta against Spark's Kafka source -> Delta and Spark's Parquet -> Delta.

Why one module of ~530 lines: a benchmark is read as one script, from the setup of each
system to the table it prints; what all benchmarks share is `bench/common.py`.

The tool our users would otherwise pick is Spark's Kafka source (`spark-sql-kafka-0-10`, of
the running Spark's version, through `spark.jars.packages`). One run, the same messages
(`--messages` messages with 100-byte payloads and one or two attributes/headers):

* danube: one sealed topic (objects of 250,000 messages on local files, descriptors in a real
  etcd) and four topics (`/bench/orders4-part-0..3`) of a quarter each;
* Kafka: a single KRaft node on loopback started from jars fetched from Maven Central
  (`bench/kafka_server.py`), topics of 1 and 4 partitions holding the same payloads and
  attributes as headers, produced through Spark's Kafka sink (untimed);
* Parquet: the 1-topic rows as danube's batch read returns them (untimed), read back with
  Spark's Parquet source.

Each case writes to a new Delta table, batch (`spark.read`) or stream (`readStream` with
`Trigger.AvailableNow`), with the full schema or the like-for-like projection (danube's
payload, offset, publish_time, attributes against Kafka's value, key, offset, timestamp,
headers). Best of `--repeat` (interleaved) on a local[2] SparkSession with Delta. CPU seconds
are split into the Spark side (the JVM, its Python workers, this process) and the broker
side (Kafka's JVM; etcd for danube, which the source reads on the driver only), so rows per
CPU second count Kafka's broker CPU on its side; ratios are taken against the same-run Kafka
case and Parquet. Finally some cases run once more, untimed, under Flight Recorder
(`bench/jfr_profile.py`, the JVM) and py-spy (`bench/pyspy_profile.py`, danube's Python side;
for the stream, its driver-side source process's CPU by activity).

Stream against batch. A stream query costs a fixed amount per query on top of what the same
rows cost in batch: Spark runs the source's driver-side methods in a fresh Python process
(`python -m pyspark.sql.streaming.python_streaming_source_runner`, not forked from the warm
worker daemon), ~1.1-1.3 CPU s whatever the rows, most of it importing pyspark from Spark's
`pyspark.zip`, which holds no bytecode (compiled from source in every such process; this
source's own imports, etcd connection, lock, cache and planning are ~0.15 s of it). So the
whole-run ratio `stream/batch cpu` (`stream_cpu_vs_batch`) falls as the rows grow, and is
reported with what separates the two parts:
* every danube and Kafka case also reads only the tail (the last `--small` messages, default
  a quarter, through `startingOffsets`), and each case's CPU is fitted as fixed + per row
  through its two best runs (`spark_cpu_fit`); `stream/batch cpu per row`
  (`stream_per_row_cpu_vs_batch`) compares the slopes and `stream fixed extra cpu s`
  (`stream_fixed_cpu_extra_s`) the intercepts. Two points on a shared machine: the slope
  ratio moves by ~0.1 between runs at load 5-9, so read it next to the next column;
* the Spark side's CPU by process (`spark_cpu_split_s`: the JVM, the pyspark.daemon tree,
  the JVM's other children, this process; `stream_overhead.ProcessCpu`), the stream's extra
  by process (`stream_cpu_extra_by_process_s`), and the stream/batch ratio without the
  source process (`stream_cpu_vs_batch_without_source_process`), measured rather than fitted;
* `--python-without-zips` (a diagnostic, results in kafka-python-without-zips.json) runs
  every Python process of Spark's with `pyspark.zip` and py4j's zip dropped from its
  PYTHONPATH, importing the installed pyspark of the same Spark (bytecode) instead.

The project's modules are byte-compiled before Spark starts (`compile_project`), as
`pip install` does: run from a checkout where `PYTHONDONTWRITEBYTECODE` is set, every fresh
Python process Spark starts (a stream's driver-side process, once per query) would compile
them from source again (~0.25 s of CPU per query), which an installed package never does.
Spark's own `pyspark.zip` is left as Spark ships it, unless `--python-without-zips`.

    python bench/bench_kafka.py [--messages 2000000] [--repeat 3] [--only danube,kafka] [--small N]

Prints a table and writes bench/results/kafka.json (`--results NAME`: NAME.json).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

BENCH_DIR = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH_DIR.parent), str(BENCH_DIR)]

import bench_connector as data  # noqa: E402  (the danube topic's frames, objects and etcd keys)
import jfr_profile  # noqa: E402
import pyspy_profile  # noqa: E402
import stream_overhead  # noqa: E402
from common import (  # noqa: E402
    Column, local_delta_builder, machine_info, print_table, run_in_workdir, timed, tree_cpu_s, write_results,
)
from kafka_server import KAFKA_VERSION, KafkaNode, fetch_kafka_jars  # noqa: E402

from devstack.short_spark_runs import python_exec_without_zips  # noqa: E402

TOPIC_1, TOPIC_4 = data.MAIN_TOPIC, [f"/bench/orders4-part-{p}" for p in range(4)]
KAFKA_TOPIC = {1: "orders-1p", 4: "orders-4p"}
CONNECT_BACK_ATTEMPTS = 3
# danube's like-for-like columns are also named in a schema (`connectors.schema.projected_columns`),
# as a user who needs only them reads: the others are then never decoded nor sent to the JVM.
DANUBE_NARROW_SCHEMA = "payload binary, offset bigint, publish_time timestamp, attributes map<string,string>"
LIKE_FOR_LIKE = {"danube": ["payload", "offset", "publish_time", "attributes"],
                 "kafka": ["value", "key", "offset", "timestamp", "headers"],
                 "parquet": ["payload", "offset", "publish_time", "attributes"]}


@dataclass(frozen=True)
class Case:
    """One measured read -> Delta: which source, batch or stream, which columns, partitions."""

    system: str  # danube | kafka | parquet
    stream: bool
    narrow: bool  # the like-for-like projection instead of the full schema
    parts: int
    tail: bool = False  # only the last --small messages (split evenly over the topics/partitions)

    @property
    def name(self) -> str:
        mode = "stream availableNow" if self.stream else "batch"
        unit = "topic" if self.system == "danube" else "partition"
        cols = "4 cols" if self.narrow else "full"
        return f"{self.system} {mode}, {self.parts} {unit}{'s' if self.parts > 1 else ''}, {cols}" + \
            (", tail" if self.tail else "")

    def whole(self) -> "Case":
        return Case(self.system, self.stream, self.narrow, self.parts)


def all_cases(only: set[str], parts: list[int], tails: bool) -> list[Case]:
    """Every case; with `tails`, each danube and Kafka case also reads the tail only, so each
    case's CPU can be fitted as fixed + per row (`stream_overhead.linear_fit`)."""
    cases = [Case("parquet", False, narrow, 1) for narrow in (False, True)]
    cases += [Case(system, stream, narrow, n, tail) for n in parts for tail in ((False, True) if tails else (False,))
              for stream in (False, True) for narrow in (True, False) for system in ("danube", "kafka")]
    return [c for c in cases if c.system in only]


# ---- data ----------------------------------------------------------------------------------


def write_danube_topics(store, endpoint: str, frames: bytes, positions, messages: int) -> None:
    """The 1-topic data (objects of OBJECT_MESSAGES) and four topics of messages // 4 each."""
    from danube_core.topics import TopicName

    data.write_main_topic(store, endpoint, frames, positions, messages)
    quarter, view, created = messages // 4, memoryview(frames), int(time.time())
    for name in TOPIC_4:
        topic, descriptors = TopicName.parse(name), []
        for k, first in enumerate(range(0, quarter, data.OBJECT_MESSAGES)):
            stop = min(quarter, first + data.OBJECT_MESSAGES)
            rel = positions[first:stop] - positions[first]
            descriptors.append(data.write_object(store, topic, view[positions[first]:positions[stop]], first, rel,
                                                 created + k))
        data.put_all(endpoint, data.topic_items(topic, descriptors, quarter - 1))


def produce_kafka(spark, bootstrap: str, parquet: Path, messages: int) -> None:
    """The Parquet rows into Kafka: all of them into one partition, and the first quarter into
    each of four partitions (as the four danube topics hold). Attributes become headers."""
    from pyspark.sql import functions as F

    jvm = spark.sparkContext._jvm
    props = jvm.java.util.Properties()
    props.put("bootstrap.servers", bootstrap)
    admin = jvm.org.apache.kafka.clients.admin.Admin.create(props)
    try:
        topics = jvm.java.util.ArrayList()
        for parts, name in KAFKA_TOPIC.items():
            topics.add(jvm.org.apache.kafka.clients.admin.NewTopic(
                name, jvm.java.util.Optional.of(parts), jvm.java.util.Optional.empty()))
        admin.createTopics(topics).all().get()
    finally:
        admin.close()
    rows = spark.read.parquet(str(parquet)).select(
        F.col("payload").alias("value"), "offset",
        F.expr("transform(map_entries(attributes), e -> struct(e.key AS key, CAST(e.value AS BINARY) AS value))")
        .alias("headers"))
    quarter = rows.where(F.col("offset") < messages // 4).crossJoin(
        spark.range(4).select(F.col("id").cast("int").alias("partition")))
    for name, df in ((KAFKA_TOPIC[1], rows.withColumn("partition", F.lit(0))), (KAFKA_TOPIC[4], quarter)):
        (df.drop("offset").write.format("kafka").option("kafka.bootstrap.servers", bootstrap)
         .option("kafka.linger.ms", "10").option("kafka.batch.size", str(1 << 18)).option("topic", name).save())


# ---- Spark ---------------------------------------------------------------------------------


def compile_project() -> list[str]:
    """Byte-compile the packages Spark's Python processes import, as an installed package is."""
    import compileall

    packages = ["connectors", "danube_core", "pyspark_danube"]
    for name in packages:
        if not compileall.compile_dir(str(BENCH_DIR.parent / name), quiet=1):
            raise RuntimeError(f"byte-compiling {name} failed")
    return packages


def start_spark(warehouse: Path, python_exec: Path | None = None):
    """local[2] with Delta and the Kafka source of this Spark's version from Maven Central;
    `python_exec`: the `spark.pyspark.python` of Spark's Python processes (a diagnostic)."""
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCH_DIR.parent), os.environ.get("PYTHONPATH")]))
    import pyspark
    from delta import configure_spark_with_delta_pip

    import connectors

    builder = local_delta_builder("bench-kafka", warehouse)
    if python_exec is not None:  # pyspark takes its workers' (and a stream source's) python from the env
        os.environ["PYSPARK_PYTHON"] = str(python_exec)
        builder = builder.config("spark.pyspark.python", str(python_exec))
    kafka_package = f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"
    spark = configure_spark_with_delta_pip(builder, extra_packages=[kafka_package]).getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    connectors.register(spark)
    return spark


class Inputs:
    """DataFrame factories for each case, over the data written once."""

    def __init__(self, spark, danube_options: dict, bootstrap: str, parquet: Path, messages: int, small: int) -> None:
        self.spark, self.options, self.bootstrap, self.parquet = spark, danube_options, bootstrap, parquet
        self.messages, self.small = messages, small
        self.systems: set[str] = set()
        self.retries: dict[str, int] = {}  # runs repeated because a Python worker started too slowly

    def rows(self, case: Case) -> int:
        per_part = (self.small if case.tail else self.messages) // case.parts
        return per_part * case.parts

    def _tail_start(self, case: Case) -> int:
        """The first offset a tail case reads in each topic/partition (each holds messages // parts)."""
        return self.messages // case.parts - self.small // case.parts

    def frame(self, case: Case):
        reader = self.spark.readStream if case.stream else self.spark.read
        if case.system == "parquet":
            df = reader.parquet(str(self.parquet))
        elif case.system == "danube":
            topics = [TOPIC_1] if case.parts == 1 else TOPIC_4
            starting = json.dumps({t: self._tail_start(case) for t in topics}) if case.tail else "earliest"
            df = (reader.format("danube").options(**self.options).option("topic", ",".join(topics))
                  .option("startingOffsets", starting))
            if case.narrow:
                df = df.schema(DANUBE_NARROW_SCHEMA)
            if case.stream:
                df = df.option("subscription", f"bench-{uuid.uuid4().hex[:10]}")
            df = df.load()
        else:
            name = KAFKA_TOPIC[case.parts]
            starting = (json.dumps({name: {str(p): self._tail_start(case) for p in range(case.parts)}})
                        if case.tail else "earliest")
            df = (reader.format("kafka").option("kafka.bootstrap.servers", self.bootstrap)
                  .option("subscribe", name).option("startingOffsets", starting)
                  .option("includeHeaders", "true"))
            df = (df if case.stream else df.option("endingOffsets", "latest")).load()
        return df.select(*LIKE_FOR_LIKE[case.system]) if case.narrow else df


def to_delta(spark, df, stream: bool, out: Path, rows: int) -> None:
    if stream:
        query = (df.writeStream.format("delta").option("checkpointLocation", str(out) + "-chk")
                 .trigger(availableNow=True).start(str(out)))
        query.awaitTermination()
        if query.exception() is not None:
            raise RuntimeError(f"stream into {out} failed: {query.exception()}")
    else:
        df.write.format("delta").save(str(out))
    written = spark.read.format("delta").load(str(out)).count()
    shutil.rmtree(out)
    shutil.rmtree(str(out) + "-chk", ignore_errors=True)
    if written != rows:
        raise RuntimeError(f"{out}: the Delta table has {written} rows, expected {rows}")


@dataclass
class Run:
    wall_s: float
    spark_cpu_s: float
    broker_cpu_s: float
    load_1m: float
    split: dict[str, float]  # the Spark side's CPU by process (stream_overhead.ProcessCpu)


def measure(inputs: Inputs, case: Case, out: Path, servers: dict[str, int], jvm: int) -> Run:
    """One run: wall, CPU of the Spark side (everything under this process but the servers)
    and of the case's own broker side (Kafka's JVM, or etcd for danube)."""
    def cpus() -> dict[str, float]:
        return {"all": tree_cpu_s(), **{name: tree_cpu_s(pid) for name, pid in servers.items()}}

    rows = inputs.rows(case)
    for attempt in range(1, CONNECT_BACK_ATTEMPTS + 1):
        processes = stream_overhead.ProcessCpu(jvm).__enter__()  # its /proc scans stay outside `cpus()`
        before = cpus()
        try:
            with timed() as t:
                to_delta(inputs.spark, inputs.frame(case), case.stream, out, rows)
            after = cpus()
            processes.__exit__()
            break
        except Exception as exc:  # Spark's own 10 s limit for a new Python process, under heavy load
            if "failed to connect back" not in str(exc) or attempt == CONNECT_BACK_ATTEMPTS:
                raise
            inputs.retries[case.name] = inputs.retries.get(case.name, 0) + 1
            print(f"  {case.name}: a Python worker did not connect back in time (load "
                  f"{os.getloadavg()[0]:.1f}); run again", flush=True)
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(str(out) + "-chk", ignore_errors=True)
    spent = {k: after[k] - before[k] for k in after}
    side = {"kafka": "kafka", "danube": "etcd"}.get(case.system)
    spark_cpu = spent["all"] - sum(spent[name] for name in servers)
    split = {**processes.split, "benchmark_process": round(spark_cpu - sum(processes.split.values()), 2)}
    return Run(t.wall_s, spark_cpu, spent[side] if side else 0.0, round(os.getloadavg()[0], 2), split)


def summarise(runs: dict[Case, list[Run]], rows_of: Callable[[Case], int]) -> list[dict]:
    """Best wall and best CPU per case; ratios against Kafka's same case and Parquet's; for a
    stream, its CPU against the batch's, for the whole run and per row (`per_row`)."""
    out: dict[Case, dict] = {}
    for case, rs in runs.items():
        best = min(rs, key=lambda r: r.spark_cpu_s + r.broker_cpu_s)
        cpu, rows = best.spark_cpu_s + best.broker_cpu_s, rows_of(case)
        out[case] = {"case": case.name, "rows": rows, "wall_s": round(min(r.wall_s for r in rs), 2),
                     "spark_cpu_s": round(best.spark_cpu_s, 2), "broker_cpu_s": round(best.broker_cpu_s, 2),
                     "rows_per_cpu_s": round(rows / cpu), "load_1m": best.load_1m, "spark_cpu_split_s": best.split,
                     "runs": [{"wall_s": round(r.wall_s, 2), "spark_cpu_s": round(r.spark_cpu_s, 2),
                               "broker_cpu_s": round(r.broker_cpu_s, 2), "load_1m": r.load_1m,
                               "spark_cpu_split_s": r.split} for r in rs]}
    per_row(out)
    for case, row in out.items():
        kafka = out.get(Case("kafka", case.stream, case.narrow, case.parts, case.tail))
        if case.system == "danube" and kafka:
            row["wall_vs_kafka"] = round(kafka["wall_s"] / row["wall_s"], 2)
            row["cpu_rate_vs_kafka"] = round(row["rows_per_cpu_s"] / kafka["rows_per_cpu_s"], 2)
        parquet = out.get(Case("parquet", False, case.narrow, 1))
        if parquet and case.parts == 1 and not case.tail:
            row["wall_vs_parquet"] = round(parquet["wall_s"] / row["wall_s"], 2)
            row["cpu_rate_vs_parquet"] = round(row["rows_per_cpu_s"] / parquet["rows_per_cpu_s"], 2)
        batch = out.get(Case(case.system, False, case.narrow, case.parts, case.tail))
        if case.stream and batch:
            row["stream_cpu_vs_batch"] = round(row["spark_cpu_s"] / batch["spark_cpu_s"], 3)
            row["stream_cpu_extra_by_process_s"] = {  # where the whole-run difference is, by process
                k: round(v - batch["spark_cpu_split_s"][k], 2) for k, v in row["spark_cpu_split_s"].items()}
            # The stream's driver-side source process exists once per query, whatever the rows
            # (its CPU is the same for the tail and the whole topics): the rest, compared.
            fresh, batch_fresh = row["spark_cpu_split_s"]["jvm_children"], batch["spark_cpu_split_s"]["jvm_children"]
            row["stream_cpu_vs_batch_without_source_process"] = round(
                (row["spark_cpu_s"] - fresh) / (batch["spark_cpu_s"] - batch_fresh), 3)
    return list(out.values())


def per_row(out: dict[Case, dict]) -> None:
    """Each case measured at two sizes (the whole topics and their tail): its Spark-side CPU
    fitted as fixed + per row through the two best runs; for a stream, its per-row CPU and
    its fixed CPU against the same batch case's (`stream_per_row_cpu_vs_batch`,
    `stream_fixed_cpu_extra_s`). The whole-run ratio weighs the stream's fixed cost per query
    by the rows of the run; the per-row ratio is what a longer backlog tends to."""
    for case, row in out.items():
        tail = out.get(Case(case.system, case.stream, case.narrow, case.parts, True))
        if case.tail or tail is None:
            continue
        fit = stream_overhead.linear_fit(tail["rows"], tail["spark_cpu_s"], row["rows"], row["spark_cpu_s"])
        row["spark_cpu_fit"] = {"fixed_s": round(fit.fixed_s, 2), "per_million_rows_s": round(fit.per_row_s * 1e6, 3),
                                "rows": [tail["rows"], row["rows"]]}
    for case, row in out.items():
        batch = out.get(Case(case.system, False, case.narrow, case.parts, case.tail))
        if case.stream and batch and "spark_cpu_fit" in row and "spark_cpu_fit" in batch:
            stream_fit, batch_fit = row["spark_cpu_fit"], batch["spark_cpu_fit"]
            row["stream_per_row_cpu_vs_batch"] = round(stream_fit["per_million_rows_s"] /
                                                       batch_fit["per_million_rows_s"], 3)
            row["stream_fixed_cpu_extra_s"] = round(stream_fit["fixed_s"] - batch_fit["fixed_s"], 2)


def stream_extra(runs: dict[Case, list[Run]]) -> dict:
    """Per system, the stream's extra Spark-side CPU over the batch's by process, averaged
    over all runs of every stream case and its batch case (whole and tail): a fixed cost per
    query shows as the same extra at both sizes, a per-row one grows with the rows. Means
    of all runs, not best runs: steadier on a shared machine than a fit through two points."""
    out: dict[str, dict] = {}
    for system in sorted({c.system for c in runs if c.stream}):
        pairs = [(runs[c], runs[Case(c.system, False, c.narrow, c.parts, c.tail)]) for c in runs
                 if c.system == system and c.stream and Case(c.system, False, c.narrow, c.parts, c.tail) in runs]
        keys = pairs[0][0][0].split.keys()
        out[system] = {"cases": len(pairs), "extra_cpu_s_by_process": {
            k: round(statistics.mean(statistics.mean(r.split[k] for r in s) - statistics.mean(r.split[k] for r in b)
                                     for s, b in pairs), 2) for k in keys},
            "jvm_extra_cpu_s_per_case": [round(statistics.mean(r.split["jvm"] for r in s) -
                                               statistics.mean(r.split["jvm"] for r in b), 2) for s, b in pairs]}
    return out


def profiles(inputs: Inputs, jvm_pid: int, work: Path) -> dict:
    """Untimed runs under the profilers: the JVM (Flight Recorder) for each system's full-schema
    batch, and the Python side too (py-spy) for danube, batch and stream."""
    result: dict = {}
    cases = [Case("danube", False, False, 1), Case("danube", True, False, 1), Case("kafka", False, False, 1),
             Case("parquet", False, False, 1)]
    for case in cases:
        if case.system not in inputs.systems:
            continue
        python = pyspy_profile.PythonProfile(jvm_pid) if case.system == "danube" and pyspy_profile.available() else None
        jvm = jfr_profile.JvmProfile(jvm_pid) if jfr_profile.available() else None
        try:
            with python or nullcontext(), jvm or nullcontext():
                to_delta(inputs.spark, inputs.frame(case), case.stream, work / "delta-profile", inputs.rows(case))
        except Exception as exc:  # a profile is evidence, not a result: report and go on
            result[case.name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            shutil.rmtree(work / "delta-profile", ignore_errors=True)
            shutil.rmtree(str(work / "delta-profile") + "-chk", ignore_errors=True)
            continue
        result[case.name] = {"python": python.summary() if python else "py-spy not installed (extra bench)",
                             "jvm": jvm.summary() if jvm else "jcmd/jfr not found (a JDK is needed)"}
        if python and case.stream:
            result[case.name]["stream_source_process_cpu_s"] = stream_overhead.source_process_breakdown(
                python.stacks, python.rate)
    return result


# ---- main ----------------------------------------------------------------------------------


def run(args: argparse.Namespace, work: Path) -> dict:
    from danube_core.embedded_etcd import EmbeddedEtcd
    from danube_core.objectstore import ObjectStore

    lib = fetch_kafka_jars()
    frames, positions = data.build_frames(args.messages)
    store = ObjectStore((work / "storage").as_uri())
    etcd_dir = tempfile.mkdtemp(prefix="bench-etcd-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    try:
        with EmbeddedEtcd(data_dir=etcd_dir) as etcd, KafkaNode(lib) as kafka:
            write_danube_topics(store, etcd.endpoint, frames, positions, args.messages)
            del frames
            options = {"etcd.endpoints": etcd.endpoint, "storage.url": store.url, "walRoot": "none"}
            compiled = compile_project()
            python_exec = python_exec_without_zips(work) if args.python_without_zips else None
            spark = start_spark(work / "warehouse", python_exec)
            try:
                parquet = work / "parquet"
                spark.read.format("danube").options(**options).option("topic", TOPIC_1).load() \
                    .write.parquet(str(parquet))
                produce_kafka(spark, kafka.bootstrap, parquet, args.messages)
                inputs = Inputs(spark, options, kafka.bootstrap, parquet, args.messages, args.small)
                inputs.systems = set(args.only)
                servers = {"kafka": kafka.pid, "etcd": etcd.process.pid}
                jvm = spark.sparkContext._gateway.proc.pid
                cases = all_cases(args.only, args.parts, tails=args.small > 0)
                for case in {c.system: c for c in reversed(cases)}.values():  # warm-up: class loading, JIT
                    measure(inputs, case, work / "delta", servers, jvm)
                runs: dict[Case, list[Run]] = {c: [] for c in cases}
                for _ in range(args.repeat):
                    for case in cases:
                        runs[case].append(measure(inputs, case, work / "delta", servers, jvm))
                        print(f"  {case.name}: {runs[case][-1]}", flush=True)
                profile = profiles(inputs, jvm, work) if args.profile else {}
            finally:
                spark.stop()
    finally:
        shutil.rmtree(etcd_dir, ignore_errors=True)
    return {"benchmark": "kafka", **machine_info(), "messages": args.messages, "tail_messages": args.small,
            "payload_bytes": data.PAYLOAD_BYTES, "kafka_version": KAFKA_VERSION, "repeat": args.repeat,
            "cases": summarise(runs, inputs.rows), "stream_extra_by_process": stream_extra(runs),
            "profiles": profile, "retried_runs": inputs.retries,
            "byte_compiled_before_run": compiled,
            "python_exec": ("diagnostic: pyspark.zip and py4j's zip dropped from PYTHONPATH (the installed pyspark)"
                            if python_exec else "Spark's default (pyspark.zip first on PYTHONPATH)"),
            "goals": {"wall_vs_kafka": 1.0, "cpu_rate_vs_kafka": 1.0, "wall_vs_parquet": 0.8,
                      "stream_cpu_vs_batch": 1.05}}


def report(result: dict) -> None:
    print(f"\n{result['messages']:,} messages of {result['payload_bytes']} B, Kafka {result['kafka_version']}; "
          f"load average {result['load_average_1m_start']} -> {result['load_average_1m']} on {result['cpu_count']} "
          "CPUs (rows/cpu-s counts the broker side)")
    print_table(result["cases"], [
        Column("case -> delta", "case"), Column("wall s", "wall_s", "{:.2f}"), Column("spark cpu s", "spark_cpu_s", "{:.2f}"),
        Column("broker cpu s", "broker_cpu_s", "{:.2f}"), Column("rows/cpu-s", "rows_per_cpu_s", "{:,}"),
        Column("load", "load_1m"), Column("x kafka wall", "wall_vs_kafka"), Column("x kafka cpu", "cpu_rate_vs_kafka"),
        Column("x parquet wall", "wall_vs_parquet"), Column("x parquet cpu", "cpu_rate_vs_parquet"),
        Column("stream/batch cpu", "stream_cpu_vs_batch"),
        Column("stream/batch cpu per row", "stream_per_row_cpu_vs_batch"),
        Column("stream fixed extra cpu s", "stream_fixed_cpu_extra_s"),
        Column("stream/batch cpu w/o source process", "stream_cpu_vs_batch_without_source_process")])
    print("\nSpark-side CPU s by process (best run): the JVM, the pyspark.daemon tree (read(), batch planning), "
          "the JVM's other children (a stream's source process), this benchmark's process")
    print_table(result["cases"], [
        Column("case -> delta", "case"), Column("jvm", "spark_cpu_split_s", "{[jvm]:.2f}"),
        Column("daemon tree", "spark_cpu_split_s", "{[python_workers]:.2f}"),
        Column("jvm children", "spark_cpu_split_s", "{[jvm_children]:.2f}"),
        Column("benchmark", "spark_cpu_split_s", "{[benchmark_process]:.2f}"),
        Column("fit: fixed s", "spark_cpu_fit", "{[fixed_s]:.2f}"),
        Column("fit: s per M rows", "spark_cpu_fit", "{[per_million_rows_s]:.3f}")])
    for system, extra in result["stream_extra_by_process"].items():
        print(f"\n{system}: stream minus batch, Spark-side CPU s by process, mean over {extra['cases']} case pairs "
              f"(whole and tail) of their runs' means: " +
              ", ".join(f"{k} {v:+.2f}" for k, v in extra["extra_cpu_s_by_process"].items()))
    for name, prof in result["profiles"].items():
        for side in ("python", "jvm"):
            p = prof.get(side)
            if not isinstance(p, dict):
                continue
            what = (f"py-spy, ~{p['cpu_s_estimate']} CPU s of Python in {p['processes']} process trees"
                    if side == "python" else "Flight Recorder, Java threads in Java code")
            print(f"\n{name}: {p['samples']:,} samples ({what})")
            print_table(p["own"][:10], [Column("own samples", "function"), Column("share", "share", "{:.0%}")])
        if "stream_source_process_cpu_s" in prof:
            print(f"\n{name}: the stream's source process (py-spy), CPU s by activity")
            print_table([{"what": k, "s": v} for k, v in prof["stream_source_process_cpu_s"].items()],
                        [Column("activity", "what"), Column("cpu s", "s", "{:.2f}")])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=3, help="runs per case (the best is kept)")
    parser.add_argument("--only", type=lambda s: set(s.split(",")), default={"parquet", "danube", "kafka"},
                        help="comma-separated systems to measure: parquet, danube, kafka")
    parser.add_argument("--parts", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4],
                        help="partitions (Kafka) / topics (danube) to measure: 1, 4 or 1,4")
    parser.add_argument("--no-profile", dest="profile", action="store_false", help="skip the py-spy runs")
    parser.add_argument("--small", type=int, default=None,
                        help="each danube/Kafka case also reads only the last SMALL messages, for the fixed + "
                             "per-row fit (default messages // 4; 0: no tail runs)")
    parser.add_argument("--python-without-zips", action="store_true",
                        help="diagnostic: Spark's Python processes import the installed pyspark, not pyspark.zip "
                             "(results in kafka-python-without-zips.json)")
    parser.add_argument("--results", default=None,
                        help="name of the JSON under bench/results (default kafka, or kafka-python-without-zips)")
    args = parser.parse_args(argv)
    args.small = args.messages // 4 if args.small is None else args.small
    if args.messages < 4 or args.repeat < 1 or not args.only <= {"parquet", "danube", "kafka"} \
            or not set(args.parts) <= {1, 4} or not (args.small == 0 or 4 <= args.small < args.messages):
        parser.error("--messages must be >= 4, --repeat >= 1, --only among parquet,danube,kafka, --parts among "
                     "1,4, --small 0 or in [4, messages)")
    result = run_in_workdir("bench-kafka-", lambda work: run(args, work))
    report(result)
    write_results(args.results or ("kafka-python-without-zips" if args.python_without_zips else "kafka"), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
