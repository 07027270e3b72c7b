"""A pipeline's topics read past its Delta table, split into target rows as the pipeline splits them.

The speed layer serves a dataset's tail (the messages its newest epoch does not hold yet) beside
the epoch. Those rows must be exactly the rows the pipeline will append to its Delta table, so
they are made here, by the pipeline's own code, from the pipeline's own file:

* read through the connector's own driver and executor paths (a stream driver's catalog over
  its `connectors.query_scope.QueryScope`: the topics' etcd keys held by a watch, so the
  follower's frequent look at the head reads memory, not etcd; `connectors.batch.topics_of`,
  `topics_of`, `connectors.partitions.plan_partitions` and `read_partition`): sealed objects
  first, then the owner's WAL through fsspec, CRC-checked and offset-continuous, with the
  pipeline's `failOnDataLoss` (offsets gone from the topic fail the read, never skipped);
* decoded by the pipeline's `Decoder` (registry subject, the version each message names, else
  the latest) and checked by its `QualityGate` (the same suite, on great-expectations' pandas
  engine where the pipeline would use it too), marked with `mark_failures` and cut with
  `target_rows`: a row the pipeline would quarantine is never in what this returns.

Most messages are split without Spark (`pipelines.tail_split`: plain JSON objects of the
declared scalar types, under a suite great-expectations' pandas engine runs for the pipeline
too), because a Spark split costs each read 0.7-1.9 s whatever its size. The rest is decoded on
a small local Spark session of this process (one core, no UI), started the first time a read
needs it, because the pipeline's decode is Spark's `from_json`/`from_avro`: re-implementing it
beyond what is plain would answer rows that Delta later holds differently. Rows of a message
naming no schema version are decoded with the subject's latest version at the time, as a new
batch of the pipeline would.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

import pyarrow as pa

from pipelines.config import PipelineConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pipelines.expectations import QualityGate

logger = logging.getLogger(__name__)

_SESSION_LOCK = threading.Lock()
HEAD_POLL_S = 0.01  # between looks at the head while a long poll waits (the broker flushes its WAL every 20 ms)
TAIL_SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "1",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.memory": "512m",
}


@dataclass(frozen=True)
class TailBatch:
    """What one read gave: the target rows, the offsets read per topic partition (`first`, `ends`:
    `[first, end)`), how many messages that was and how many the pipeline would quarantine."""

    rows: pa.Table
    first: Mapping[str, int]
    ends: Mapping[str, int]
    read: int
    quarantined: int


def tail_session(avro: bool = False) -> "SparkSession":
    """The process's local Spark session for tail decoding (created once). Spark's Avro functions
    are fetched only for an Avro pipeline: resolving a package costs every tail's start."""
    from pyspark.sql import SparkSession

    from pipelines.session import avro_package, running_spark_version

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    with _SESSION_LOCK:
        builder = SparkSession.builder.appName("danube-tail").master("local[1]")
        for key, value in TAIL_SPARK_CONF.items():
            builder = builder.config(key, value)
        if avro:
            builder = builder.config("spark.jars.packages", avro_package(running_spark_version()))
        return builder.getOrCreate()


class TailFeed:
    """Reads and splits a pipeline's topics; `close()` releases its etcd connection."""

    def __init__(self, config: PipelineConfig, spark: "SparkSession | None" = None) -> None:
        from connectors import options as opt
        from connectors.batch import new_catalog, topics_of
        from connectors.query_scope import QueryScope
        from danube_core.cached_store import CachedMetadataStore
        from pipelines.decode import Decoder
        from pipelines.runner import reader_options
        from pipelines.subject_schemas import SubjectSchemas
        from pipelines.tail_split import ArrowSplit

        self.config = config
        # failOnDataLoss on whatever the pipeline says: the tail reports a loss, it never skips one
        self.options = dataclasses.replace(opt.parse_options(reader_options(config.source)), fail_on_data_loss=True)
        self._metadata = self.options.etcd.connect()
        try:
            self._scope = QueryScope(self._metadata, self.options, name=f"tail-{config.name}").start()
        except BaseException:
            self._metadata.close()
            raise
        self._catalog = new_catalog(self.options, CachedMetadataStore(self._metadata, self._scope.cache))
        self._topics_of = topics_of
        self._indexed: set[str] = set()  # topics the namespace index has listed while the tail followed them
        subject = config.decode.subject
        self.decoder = Decoder(config.decode, SubjectSchemas(self._metadata, subject) if subject else None)
        self._gate: QualityGate | None = None
        self._spark = spark
        self._arrow = ArrowSplit(self.decoder, config.expectations.rules if config.expectations is not None else None)

    @property
    def gate(self) -> "QualityGate | None":
        """The pipeline's suite (its great-expectations context is built by the first Spark split)."""
        from pipelines.expectations import QualityGate

        if self._gate is None and self.config.expectations is not None:
            self._gate = QualityGate(self.config.expectations)
        return self._gate

    @property
    def spark(self) -> "SparkSession":
        """The local session, started by the first read that has messages only Spark decodes."""
        if self._spark is None:
            self._spark = tail_session(self.config.decode.format == "avro")
        return self._spark

    def close(self) -> None:
        self._scope.close()
        self._metadata.close()

    def topics(self) -> list[str]:
        """The topic partitions the pipeline reads (broker names), as the pipeline resolves them."""
        topics = self._topics_of(self._catalog, self.options)
        self._scope.follow(topics)
        return topics

    def earliest(self, topics: list[str]) -> dict[str, int]:
        return self._catalog.earliest_offsets(topics)

    def latest(self, topics: list[str], above: Mapping[str, int] | None = None, wait_s: float = 0.0) -> dict[str, int]:
        """Per topic partition, the next offset not yet readable (end-exclusive); with `above`,
        once one of them is beyond it or `wait_s` has passed (the follower's long poll: a look at
        the head reads the scope's cache and the WAL bytes added since, well under a millisecond,
        where a request from the worker every few milliseconds cost both processes a core's fifth)."""
        self._refuse_deleted(topics)
        deadline = time.monotonic() + wait_s
        while True:
            latest = self._catalog.latest_offsets(topics)
            if above is None or any(n > above.get(t, n) for t, n in latest.items()) or time.monotonic() >= deadline:
                return latest
            time.sleep(HEAD_POLL_S)

    def _refuse_deleted(self, topics: list[str]) -> None:
        """Raise `TopicDeletedError` for a topic deleted since the tail began following it: the
        broker drops its keys and WAL, and without this the head would look unchanged and the
        tail say `following` for ever (the namespace index is in the scope's watched cache, so
        this costs no etcd request)."""
        from danube_core.errors import TopicDeletedError
        from danube_core.keys import namespace_topic_key

        present = self._catalog.indexed(topics)
        self._indexed |= present
        gone = sorted(self._indexed.intersection(topics) - present)  # as the stream: listed once, now gone
        if gone:
            raise TopicDeletedError(f"topic {gone[0]} was deleted (its namespace-index entry "
                                    f"{namespace_topic_key(gone[0])} is gone): the tail reads it no more")

    def read(self, start: Mapping[str, int], end: Mapping[str, int]) -> TailBatch:
        """`[start[t], end[t])` of each topic, read, decoded and split; raises `DataLossError`
        for offsets the topic no longer has, whatever the pipeline's failOnDataLoss says (the
        tail reports a loss, it never skips one)."""
        from connectors.partitions import plan_partitions, read_partition

        wanted = {t: e for t, e in end.items() if e > start.get(t, e)}
        first = {t: start[t] for t in wanted}
        if not wanted:
            return TailBatch(pa.table({}), {}, {}, 0, 0)
        for topic, offset in first.items():  # the cached window reaches down to the read, moves up behind it
            self._scope.reach(topic, offset, self._catalog.covering_start)
        self._scope.advance(first)
        batches = [b for p in plan_partitions(self._catalog, self.options, first, wanted)
                   for b in read_partition(p, include_source=True)]
        read = sum(b.num_rows for b in batches)
        rows = self.split(batches) if read else pa.table({})
        return TailBatch(rows, first, wanted, read, read - rows.num_rows)

    def split(self, batches: list[pa.RecordBatch]) -> pa.Table:
        """The target rows of `batches`: the plain messages split in Arrow, the rest by Spark."""
        plain, rest = self._arrow.split(batches)
        if not rest:
            return plain if plain is not None else pa.table({})
        rows = self._split(rest)
        if plain is None or not plain.num_rows:
            return rows
        # one schema whichever way a row was split (tests/spark/test_tail_split.py holds them equal);
        # promoted should a version registered between the two splits have added a column
        return pa.concat_tables([plain, rows], promote_options="permissive")

    def _split(self, batches: list[pa.RecordBatch]) -> pa.Table:
        return spark_split(self.spark, self.decoder, self.gate, batches)


def spark_split(spark: "SparkSession", decoder: Any, gate: "QualityGate | None", batches: list[pa.RecordBatch]) -> pa.Table:
    """The target rows of `batches`, exactly as `DeltaBatchWriter` splits a micro-batch."""
    from connectors.schema import spark_schema
    from pipelines.batch_summary import decodable_rows
    from pipelines.decode import PAYLOAD
    from pipelines.delta_sink import target_rows
    from pipelines.expectations import FAILED, mark_failures, no_failures

    from pyspark.sql import functions as F

    frame = spark.createDataFrame(pa.Table.from_batches(batches), schema=spark_schema(True))
    decoded = decoder.decode(decoder.prepare(frame)).persist()
    try:
        if gate is None:
            marked = decoded.withColumn(FAILED, no_failures())
        else:
            decodable = decoded.filter(decodable_rows()).drop(PAYLOAD)
            columns = gate.pandas_columns(decoded)
            collected = decodable.select(*[F.col(c) for c in columns]).toArrow() if columns else None
            count = collected.num_rows if collected is not None else decodable.count()
            quality = gate.validate(decodable, count, collected)
            marked = mark_failures(spark, decoded, quality)
        return target_rows(marked).toArrow()
    finally:
        decoded.unpersist()
