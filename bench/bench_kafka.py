"""`format("danube")` -> Delta against Spark's Kafka source -> Delta and Spark's Parquet -> Delta.

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
(`bench/jfr_profile.py`, the JVM) and py-spy (`bench/pyspy_profile.py`, danube's Python side).

The project's modules are byte-compiled before Spark starts (`compile_project`), as
`pip install` does: run from a checkout where `PYTHONDONTWRITEBYTECODE` is set, every fresh
Python process Spark starts (a stream's driver-side process, once per query) would compile
them from source again (~0.25 s of CPU per query), which an installed package never does.
Spark's own `pyspark.zip`, which holds no bytecode, is left as Spark ships it: its compile
(~1 s of CPU in each stream query's driver-side process) is part of every figure.

    python bench/bench_kafka.py [--messages 2000000] [--repeat 3] [--only danube,kafka]

Prints a table and writes bench/results/kafka.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH_DIR.parent), str(BENCH_DIR)]

import bench_connector as data  # noqa: E402  (the danube topic's frames, objects and etcd keys)
import jfr_profile  # noqa: E402
import pyspy_profile  # noqa: E402
from common import Column, machine_info, print_table, run_in_workdir, timed, tree_cpu_s, write_results  # noqa: E402
from kafka_server import KAFKA_VERSION, KafkaNode, fetch_kafka_jars  # noqa: E402

TOPIC_1, TOPIC_4 = data.MAIN_TOPIC, [f"/bench/orders4-part-{p}" for p in range(4)]
KAFKA_TOPIC = {1: "orders-1p", 4: "orders-4p"}
CONNECT_BACK_ATTEMPTS = 3
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

    @property
    def name(self) -> str:
        mode = "stream availableNow" if self.stream else "batch"
        unit = "topic" if self.system == "danube" else "partition"
        cols = "4 cols" if self.narrow else "full"
        return f"{self.system} {mode}, {self.parts} {unit}{'s' if self.parts > 1 else ''}, {cols}"


def all_cases(only: set[str], parts: list[int]) -> list[Case]:
    cases = [Case("parquet", False, narrow, 1) for narrow in (False, True)]
    cases += [Case(system, stream, narrow, n) for n in parts for stream in (False, True)
              for narrow in (True, False) for system in ("danube", "kafka")]
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


def start_spark(warehouse: Path):
    """local[2] with Delta and the Kafka source of this Spark's version from Maven Central."""
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCH_DIR.parent), os.environ.get("PYTHONPATH")]))
    import pyspark
    from delta import configure_spark_with_delta_pip
    from pyspark.sql import SparkSession

    import connectors

    builder = (SparkSession.builder.master("local[2]").appName("bench-kafka")
               .config("spark.sql.shuffle.partitions", "2").config("spark.default.parallelism", "2")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.warehouse.dir", str(warehouse))
               .config("spark.databricks.delta.snapshotPartitions", "2")
               .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
               .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"))
    kafka_package = f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"
    spark = configure_spark_with_delta_pip(builder, extra_packages=[kafka_package]).getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    connectors.register(spark)
    return spark


class Inputs:
    """DataFrame factories for each case, over the data written once."""

    def __init__(self, spark, danube_options: dict, bootstrap: str, parquet: Path) -> None:
        self.spark, self.options, self.bootstrap, self.parquet = spark, danube_options, bootstrap, parquet
        self.systems: set[str] = set()
        self.retries: dict[str, int] = {}  # runs repeated because a Python worker started too slowly

    def frame(self, case: Case):
        reader = self.spark.readStream if case.stream else self.spark.read
        if case.system == "parquet":
            df = reader.parquet(str(self.parquet))
        elif case.system == "danube":
            topics = TOPIC_1 if case.parts == 1 else ",".join(TOPIC_4)
            df = reader.format("danube").options(**self.options).option("topic", topics)
            if case.stream:
                df = df.option("subscription", f"bench-{uuid.uuid4().hex[:10]}").option("startingOffsets", "earliest")
            df = df.load()
        else:
            df = (reader.format("kafka").option("kafka.bootstrap.servers", self.bootstrap)
                  .option("subscribe", KAFKA_TOPIC[case.parts]).option("startingOffsets", "earliest")
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


def measure(inputs: Inputs, case: Case, out: Path, rows: int, servers: dict[str, int]) -> Run:
    """One run: wall, CPU of the Spark side (everything under this process but the servers)
    and of the case's own broker side (Kafka's JVM, or etcd for danube)."""
    def cpus() -> dict[str, float]:
        return {"all": tree_cpu_s(), **{name: tree_cpu_s(pid) for name, pid in servers.items()}}

    for attempt in range(1, CONNECT_BACK_ATTEMPTS + 1):
        before = cpus()
        try:
            with timed() as t:
                to_delta(inputs.spark, inputs.frame(case), case.stream, out, rows)
            break
        except Exception as exc:  # Spark's own 10 s limit for a new Python process, under heavy load
            if "failed to connect back" not in str(exc) or attempt == CONNECT_BACK_ATTEMPTS:
                raise
            inputs.retries[case.name] = inputs.retries.get(case.name, 0) + 1
            print(f"  {case.name}: a Python worker did not connect back in time (load "
                  f"{os.getloadavg()[0]:.1f}); run again", flush=True)
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(str(out) + "-chk", ignore_errors=True)
    after = cpus()
    spent = {k: after[k] - before[k] for k in after}
    side = {"kafka": "kafka", "danube": "etcd"}.get(case.system)
    return Run(t.wall_s, spent["all"] - sum(spent[name] for name in servers), spent[side] if side else 0.0,
               round(os.getloadavg()[0], 2))


def summarise(runs: dict[Case, list[Run]], rows: int) -> list[dict]:
    """Best wall and best CPU per case; ratios against Kafka's same case and Parquet's."""
    out: dict[Case, dict] = {}
    for case, rs in runs.items():
        best = min(rs, key=lambda r: r.spark_cpu_s + r.broker_cpu_s)
        cpu = best.spark_cpu_s + best.broker_cpu_s
        out[case] = {"case": case.name, "rows": rows, "wall_s": round(min(r.wall_s for r in rs), 2),
                     "spark_cpu_s": round(best.spark_cpu_s, 2), "broker_cpu_s": round(best.broker_cpu_s, 2),
                     "rows_per_cpu_s": round(rows / cpu), "load_1m": best.load_1m,
                     "runs": [{"wall_s": round(r.wall_s, 2), "spark_cpu_s": round(r.spark_cpu_s, 2),
                               "broker_cpu_s": round(r.broker_cpu_s, 2), "load_1m": r.load_1m} for r in rs]}
    for case, row in out.items():
        kafka = out.get(Case("kafka", case.stream, case.narrow, case.parts))
        if case.system == "danube" and kafka:
            row["wall_vs_kafka"] = round(kafka["wall_s"] / row["wall_s"], 2)
            row["cpu_rate_vs_kafka"] = round(row["rows_per_cpu_s"] / kafka["rows_per_cpu_s"], 2)
        parquet = out.get(Case("parquet", False, case.narrow, 1))
        if parquet and case.parts == 1:
            row["wall_vs_parquet"] = round(parquet["wall_s"] / row["wall_s"], 2)
            row["cpu_rate_vs_parquet"] = round(row["rows_per_cpu_s"] / parquet["rows_per_cpu_s"], 2)
        batch = out.get(Case(case.system, False, case.narrow, case.parts))
        if case.stream and batch:
            row["stream_cpu_vs_batch"] = round(row["spark_cpu_s"] / batch["spark_cpu_s"], 3)
    return list(out.values())


def profiles(inputs: Inputs, jvm_pid: int, work: Path, rows: int) -> dict:
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
                to_delta(inputs.spark, inputs.frame(case), case.stream, work / "delta-profile", rows)
        except Exception as exc:  # a profile is evidence, not a result: report and go on
            result[case.name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            shutil.rmtree(work / "delta-profile", ignore_errors=True)
            shutil.rmtree(str(work / "delta-profile") + "-chk", ignore_errors=True)
            continue
        result[case.name] = {"python": python.summary() if python else "py-spy not installed (extra bench)",
                             "jvm": jvm.summary() if jvm else "jcmd/jfr not found (a JDK is needed)"}
    return result


# ---- main ----------------------------------------------------------------------------------


def run(args: argparse.Namespace, work: Path) -> dict:
    from broker.embedded_etcd import EmbeddedEtcd
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
            spark = start_spark(work / "warehouse")
            try:
                parquet = work / "parquet"
                spark.read.format("danube").options(**options).option("topic", TOPIC_1).load() \
                    .write.parquet(str(parquet))
                produce_kafka(spark, kafka.bootstrap, parquet, args.messages)
                inputs = Inputs(spark, options, kafka.bootstrap, parquet)
                inputs.systems = set(args.only)
                servers = {"kafka": kafka.pid, "etcd": etcd.process.pid}
                rows = {1: args.messages, 4: args.messages // 4 * 4}
                cases = all_cases(args.only, args.parts)
                for case in {c.system: c for c in reversed(cases)}.values():  # warm-up: class loading, JIT
                    measure(inputs, case, work / "delta", rows[case.parts], servers)
                runs: dict[Case, list[Run]] = {c: [] for c in cases}
                for _ in range(args.repeat):
                    for case in cases:
                        runs[case].append(measure(inputs, case, work / "delta", rows[case.parts], servers))
                        print(f"  {case.name}: {runs[case][-1]}", flush=True)
                jvm = spark.sparkContext._gateway.proc.pid
                profile = profiles(inputs, jvm, work, args.messages) if args.profile else {}
            finally:
                spark.stop()
    finally:
        shutil.rmtree(etcd_dir, ignore_errors=True)
    return {"benchmark": "kafka", **machine_info(), "messages": args.messages,
            "payload_bytes": data.PAYLOAD_BYTES, "kafka_version": KAFKA_VERSION, "repeat": args.repeat,
            "cases": summarise(runs, args.messages), "profiles": profile, "retried_runs": inputs.retries,
            "byte_compiled_before_run": compiled,
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
        Column("stream/batch cpu", "stream_cpu_vs_batch")])
    for name, prof in result["profiles"].items():
        for side in ("python", "jvm"):
            p = prof.get(side)
            if not isinstance(p, dict):
                continue
            what = (f"py-spy, ~{p['cpu_s_estimate']} CPU s of Python in {p['processes']} process trees"
                    if side == "python" else "Flight Recorder, Java threads in Java code")
            print(f"\n{name}: {p['samples']:,} samples ({what})")
            print_table(p["own"][:10], [Column("own samples", "function"), Column("share", "share", "{:.0%}")])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=3, help="runs per case (the best is kept)")
    parser.add_argument("--only", type=lambda s: set(s.split(",")), default={"parquet", "danube", "kafka"},
                        help="comma-separated systems to measure: parquet, danube, kafka")
    parser.add_argument("--parts", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4],
                        help="partitions (Kafka) / topics (danube) to measure: 1, 4 or 1,4")
    parser.add_argument("--no-profile", dest="profile", action="store_false", help="skip the py-spy runs")
    args = parser.parse_args(argv)
    if args.messages < 4 or args.repeat < 1 or not args.only <= {"parquet", "danube", "kafka"} \
            or not set(args.parts) <= {1, 4}:
        parser.error("--messages must be >= 4, --repeat >= 1, --only among parquet,danube,kafka, --parts among 1,4")
    result = run_in_workdir("bench-kafka-", lambda work: run(args, work))
    report(result)
    write_results("kafka", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
