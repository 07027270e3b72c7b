"""What a user of one Spark line does with the installed wheel, run by test_spark_versions.py in
that line's venv (never by pytest itself: it imports only what the venv has).

Argument: a JSON object (etcd, storage, topic, work, pipeline or null). Steps, each reported as
one JSON line on stdout; between the two stream runs it prints `{"step": "wait"}` and reads a
line from stdin, while the test appends messages to the topic:

1. a batch read, `format("danube")` found by Spark's own lookup (no registration call);
2. an availableNow stream into Parquet; then, after more messages, the same query again;
3. a stream with `maxMessagesPerTrigger`: its error, on a Spark that cannot honour it;
4. with a pipeline file (a Spark line Delta runs on): the pipeline into Delta, in a session
   with the Delta jar the pipelines' own code names for this Spark.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pyspark.sql import SparkSession


def emit(step: str, **values: object) -> None:
    print(json.dumps({"step": step, **values}), flush=True)


def reader(spark: SparkSession, args: dict, stream: bool):  # type: ignore[no-untyped-def]
    read = spark.readStream if stream else spark.read
    return (read.format("danube").option("etcd.endpoints", args["etcd"]).option("storage.url", args["storage"])
            .option("topic", args["topic"]))


def stream_once(spark: SparkSession, args: dict) -> list[int]:
    work = Path(args["work"])
    query = (reader(spark, args, stream=True).option("subscription", "smoke").option("startingOffsets", "earliest")
             .load().select("offset", "payload").writeStream.format("parquet")
             .option("checkpointLocation", str(work / "checkpoint")).trigger(availableNow=True)
             .start(str(work / "out")))
    query.awaitTermination(300)
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return sorted(r["offset"] for r in spark.read.parquet(str(work / "out")).collect())


def main() -> None:
    args = json.loads(sys.argv[1])
    session = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false") \
        .config("spark.sql.shuffle.partitions", "1")
    if args["pipeline"] is not None:  # a Spark line with a Delta release
        from pipelines.session import DELTA_CONF, package_settings

        for key, value in {**DELTA_CONF, **package_settings()}.items():
            session = session.config(key, value)
    spark = session.getOrCreate()
    emit("spark", version=spark.version)

    rows = reader(spark, args, stream=False).load().select("offset", "payload").collect()
    emit("batch", offsets=sorted(r["offset"] for r in rows),
         payloads=sorted(bytes(r["payload"]).decode() for r in rows))

    emit("stream", offsets=stream_once(spark, args))
    emit("wait")
    sys.stdin.readline()
    emit("stream", offsets=stream_once(spark, args))

    try:
        reader(spark, args, stream=True).option("subscription", "smoke-limited") \
            .option("maxMessagesPerTrigger", "10").load().writeStream.format("noop") \
            .trigger(availableNow=True).start().awaitTermination(300)
        emit("limited", error=None)
    except Exception as error:  # noqa: BLE001  # the message is what the test checks
        emit("limited", error=str(error).splitlines()[0][:2000])

    if args["pipeline"] is not None:
        from pipelines.__main__ import main as pipelines_main

        emit("pipeline", exit=pipelines_main(["run", args["pipeline"]]))
    spark.stop()


if __name__ == "__main__":
    main()
