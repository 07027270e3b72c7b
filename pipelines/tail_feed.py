"""A pipeline's topics read past its Delta table, split into target rows as the pipeline splits them.

The speed layer serves a dataset's tail (the messages its newest epoch does not hold yet) beside
the epoch. Those rows must be exactly the rows the pipeline will append to its Delta table, so
they are made here, by the pipeline's own code, from the pipeline's own file:

* read through the connector's own driver and executor paths (`connectors.batch.open_catalog`,
  `topics_of`, `connectors.partitions.plan_partitions` and `read_partition`): sealed objects
  first, then the owner's WAL through fsspec, CRC-checked and offset-continuous, with the
  pipeline's `failOnDataLoss` (offsets gone from the topic fail the read, never skipped);
* decoded by the pipeline's `Decoder` (registry subject, the version each message names, else
  the latest) and checked by its `QualityGate` (the same suite, on great-expectations' pandas
  engine where the pipeline would use it too), marked with `mark_failures` and cut with
  `target_rows`: a row the pipeline would quarantine is never in what this returns.

The decode runs on a small local Spark session of this process (one core, no UI), because the
pipeline's decode is Spark's `from_json`/`from_avro`: re-implementing it elsewhere would answer
rows that Delta later holds differently. Rows of a message naming no schema version are decoded
with the subject's latest version at the time, as a new batch of the pipeline would.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

import pyarrow as pa

from pipelines.config import PipelineConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

_SESSION_LOCK = threading.Lock()
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
        from connectors.batch import open_catalog, topics_of
        from pipelines.decode import Decoder
        from pipelines.expectations import QualityGate
        from pipelines.runner import reader_options
        from pipelines.subject_schemas import SubjectSchemas

        self.config = config
        # failOnDataLoss on whatever the pipeline says: the tail reports a loss, it never skips one
        self.options = dataclasses.replace(opt.parse_options(reader_options(config.source)), fail_on_data_loss=True)
        self._catalog, self._metadata = open_catalog(self.options)
        self._topics_of = topics_of
        subject = config.decode.subject
        self.decoder = Decoder(config.decode, SubjectSchemas(self._metadata, subject) if subject else None)
        self.gate = QualityGate(config.expectations) if config.expectations is not None else None
        self.spark = spark if spark is not None else tail_session(config.decode.format == "avro")

    def close(self) -> None:
        self._metadata.close()

    def topics(self) -> list[str]:
        """The topic partitions the pipeline reads (broker names), as the pipeline resolves them."""
        return self._topics_of(self._catalog, self.options)

    def earliest(self, topics: list[str]) -> dict[str, int]:
        return self._catalog.earliest_offsets(topics)

    def latest(self, topics: list[str]) -> dict[str, int]:
        """Per topic partition, the next offset not yet readable (end-exclusive)."""
        return self._catalog.latest_offsets(topics)

    def read(self, start: Mapping[str, int], end: Mapping[str, int]) -> TailBatch:
        """`[start[t], end[t])` of each topic, read, decoded and split; raises `DataLossError`
        for offsets the topic no longer has, whatever the pipeline's failOnDataLoss says (the
        tail reports a loss, it never skips one)."""
        from connectors.partitions import plan_partitions, read_partition

        wanted = {t: e for t, e in end.items() if e > start.get(t, e)}
        first = {t: start[t] for t in wanted}
        if not wanted:
            return TailBatch(pa.table({}), {}, {}, 0, 0)
        batches = [b for p in plan_partitions(self._catalog, self.options, first, wanted)
                   for b in read_partition(p, include_source=True)]
        read = sum(b.num_rows for b in batches)
        rows = self._split(batches) if read else pa.table({})
        return TailBatch(rows, first, wanted, read, read - rows.num_rows)

    def _split(self, batches: list[pa.RecordBatch]) -> pa.Table:
        """The target rows of `batches`, exactly as `DeltaBatchWriter` splits a micro-batch."""
        from connectors.schema import spark_schema
        from pipelines.decode import PAYLOAD
        from pipelines.delta_sink import target_rows
        from pipelines.expectations import FAILED, mark_failures, no_failures
        from pipelines.batch_summary import decodable_rows

        from pyspark.sql import functions as F

        frame = self.spark.createDataFrame(pa.Table.from_batches(batches), schema=spark_schema(True))
        decoded = self.decoder.decode(self.decoder.prepare(frame)).persist()
        try:
            if self.gate is None:
                marked = decoded.withColumn(FAILED, no_failures())
            else:
                decodable = decoded.filter(decodable_rows()).drop(PAYLOAD)
                columns = self.gate.pandas_columns(decoded)
                collected = decodable.select(*[F.col(c) for c in columns]).toArrow() if columns else None
                count = collected.num_rows if collected is not None else decodable.count()
                quality = self.gate.validate(decodable, count, collected)
                marked = mark_failures(self.spark, decoded, quality)
            return target_rows(marked).toArrow()
        finally:
            decoded.unpersist()

