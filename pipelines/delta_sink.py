"""The foreachBatch writer: one micro-batch -> target + quarantine in Delta, exactly once, then the cursor.

Order per batch, and why it gives exactly-once:

1. decode and validate the batch. The source's rows are cached once (the decoder's look at the
   schema versions and everything after it reuse them, so the topic is read once per batch) and
   so are the decoded rows; one aggregation gives the offset spans and the decode failures, and
   great-expectations names the rows it rejects, so no further job counts anything;
2. append the valid rows to the target and the failing rows to the quarantine table, each with
   Delta's idempotent-write options `txnAppId` = pipeline name and `txnVersion` = batch id.
   Spark replays a batch with the same id and the same offsets after a crash, and Delta skips
   a write whose (appId, version) its log has already committed, so a replay adds nothing to a
   table the first attempt reached and completes the one it did not;
3. only then commit the subscription cursors in etcd (`connectors.cursor_commit`): the cursor
   never runs ahead of what Delta holds.

Each commit's `userMetadata` names the batch's offset ranges per topic partition and the
objects they were read from (`DESCRIBE HISTORY` shows where every version came from).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Callable, Mapping

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from connectors.cursor_commit import commit_cursors
from danube_core.metadata import MetadataStore
from pipelines.config import PipelineConfig, TableConfig
from pipelines.decode import DECODE_ERROR, META_COLUMNS, PAYLOAD, Decoder, prepare
from pipelines.expectations import FAILED, BatchQuality, QualityGate, mark_failures
from pipelines.metrics import BatchReport, OffsetSpan, PipelineMetrics

logger = logging.getLogger(__name__)

QUARANTINE_EXTRA = ("_pipeline", "_batch_id", "_quarantined_at")


class DeltaBatchWriter:
    """Callable for `writeStream.foreachBatch`: writes one batch as described in the module doc."""

    def __init__(
        self,
        config: PipelineConfig,
        decoder: Decoder,
        gate: QualityGate | None,
        reader_options: Mapping[str, str],
        metadata: MetadataStore,
        metrics: PipelineMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.decoder = decoder
        self.gate = gate
        self.reader_options = dict(reader_options)
        self.metadata = metadata
        self.metrics = metrics
        self.clock = clock

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        timings: dict[str, float] = {}
        started = self.clock()
        prepared = prepare(batch).persist()
        decoded: DataFrame | None = None
        try:
            decoded = self.decoder.decode(prepared).persist()
            summary = summarize(decoded)
            spans = summary.spans
            timings["decode"] = self.clock() - started
            marked, quality = self._validate(decoded, timings)
            counts = summary.counts(quality)
            mark = self.clock()
            self._write_tables(marked, counts, quality, batch_id, commit_metadata(self.config.name, batch_id, spans))
            timings["write"] = self.clock() - mark
            mark = self.clock()
            cursors = commit_cursors(self.reader_options, {t: s.end for t, s in spans.items()}, metadata=self.metadata)
            timings["cursor"] = self.clock() - mark
        finally:
            if decoded is not None:
                decoded.unpersist()
            prepared.unpersist()
        report = BatchReport(batch_id, summary.rows, counts["valid"], counts["decode"],
                             counts["expectations"], spans, cursors, quality, timings)
        self.metrics.record(report)
        logger.info("pipeline %s batch %d: %d rows, %d valid, %d quarantined, cursors %s (%.2fs)",
                    self.config.name, batch_id, report.rows, report.valid, report.quarantined, cursors,
                    report.duration_s)

    def _write_tables(self, marked: DataFrame, counts: Mapping[str, int], quality: BatchQuality | None,
                      batch_id: int, metadata: str) -> None:
        """Target, quarantine and (optionally) the quality results, each idempotent per batch."""
        if counts["valid"]:
            self._write(target_rows(marked), self.config.target, batch_id, metadata)
        if counts["decode"] + counts["expectations"]:
            self._write(quarantine_rows(marked, self.config.name, batch_id), self.config.quarantine,
                        batch_id, metadata, merge_schema=True)
        results = self.config.expectations.results if self.config.expectations else None
        if quality is not None and results is not None:
            self._write(results_frame(marked.sparkSession, self.config.name, batch_id, quality), results,
                        batch_id, metadata, merge_schema=True)

    def _validate(self, decoded: DataFrame, timings: dict[str, float]) -> tuple[DataFrame, BatchQuality | None]:
        """Run the suite on the decodable rows; every row gets `_failed_expectations`."""
        if self.gate is None:
            return decoded.withColumn(FAILED, F.array().cast("array<string>")), None
        mark = self.clock()
        decodable = decoded.filter(F.col(DECODE_ERROR).isNull()).drop(PAYLOAD)
        quality = self.gate.validate(decodable)
        timings["expectations"] = self.clock() - mark
        return mark_failures(decoded.sparkSession, decoded, quality), quality

    def _write(self, rows: DataFrame, table: TableConfig, batch_id: int, metadata: str,
               merge_schema: bool | None = None) -> None:
        merge = table.merge_schema if merge_schema is None else merge_schema
        writer = (
            rows.write.format("delta").mode("append")
            .option("txnAppId", self.config.name)
            .option("txnVersion", str(batch_id))
            .option("userMetadata", metadata)
            .option("mergeSchema", str(merge).lower())
        )
        if table.optimize_write:
            writer = writer.option("optimizeWrite", "true")
        if table.partition_by:
            writer = writer.partitionBy(*table.partition_by)
        if table.path is not None:
            writer.save(table.path)
        else:
            writer.saveAsTable(table.table)


@dataclass(frozen=True)
class BatchSummary:
    """What one aggregation over a decoded batch tells: offset spans and undecodable rows."""

    spans: Mapping[str, OffsetSpan]
    decode_failures: int

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.spans.values())

    def counts(self, quality: BatchQuality | None) -> dict[str, int]:
        """valid / decode / expectations row counts.

        great-expectations only sees decodable rows and names each row it rejects once, by its
        unique (topic, offset), so the rows it failed are counted without another Spark job.
        """
        failed = len(quality.failed_rows) if quality is not None else 0
        return {"valid": self.rows - self.decode_failures - failed, "decode": self.decode_failures,
                "expectations": failed}


def summarize(decoded: DataFrame) -> BatchSummary:
    """Per topic partition: first offset, end (last + 1), row count, objects read; and decode failures."""
    rows = decoded.groupBy("_topic").agg(
        F.min("_offset").alias("first"), F.max("_offset").alias("last"), F.count(F.lit(1)).alias("rows"),
        F.array_sort(F.collect_set("_source")).alias("sources"),
        F.count(F.col(DECODE_ERROR)).alias("undecodable"),
    ).collect()
    spans = {r["_topic"]: OffsetSpan(r["first"], r["last"] + 1, r["rows"], tuple(r["sources"] or ())) for r in rows}
    return BatchSummary(spans, sum(r["undecodable"] for r in rows))


def commit_metadata(pipeline: str, batch_id: int, spans: Mapping[str, OffsetSpan]) -> str:
    """The Delta commit's userMetadata: which offsets and objects this version holds."""
    return json.dumps(
        {
            "pipeline": pipeline,
            "batch_id": batch_id,
            "offsets": {t: {"start": s.start, "end": s.end} for t, s in sorted(spans.items())},
            "objects": sorted({src for s in spans.values() for src in s.sources}),
        },
        separators=(",", ":"),
        sort_keys=True,
    )


def target_rows(marked: DataFrame) -> DataFrame:
    """Rows that decoded and passed every expectation, without the raw payload."""
    valid = marked.filter(F.col(DECODE_ERROR).isNull() & (F.size(F.col(FAILED)) == 0))
    if "_rescued_data" not in valid.columns:  # raw format: the payload is the data
        return valid.drop(DECODE_ERROR, FAILED)
    return valid.drop(PAYLOAD, DECODE_ERROR, FAILED)


def quarantine_rows(marked: DataFrame, pipeline: str, batch_id: int) -> DataFrame:
    """Failing rows with their raw payload and why they failed (a fixed schema for every format)."""
    failing = marked.filter(F.col(DECODE_ERROR).isNotNull() | (F.size(F.col(FAILED)) > 0))
    return failing.select(
        *[F.col(c) for c in META_COLUMNS], F.col(PAYLOAD), F.col(DECODE_ERROR), F.col(FAILED),
        F.lit(pipeline).alias("_pipeline"), F.lit(batch_id).cast("long").alias("_batch_id"),
        F.current_timestamp().alias("_quarantined_at"),
    )


def results_frame(spark: SparkSession, pipeline: str, batch_id: int, quality: BatchQuality) -> DataFrame:
    """One row per expectation of the batch, for the optional `expectations.results` table."""
    rows = [
        (pipeline, batch_id, quality.suite, o.name, o.success, o.element_count, o.unexpected_count,
         None if o.observed_value is None else json.dumps(o.observed_value, default=str), quality.duration_s)
        for o in quality.outcomes
    ]
    schema = ("pipeline string, batch_id long, suite string, expectation string, success boolean, "
              "element_count long, unexpected_count long, observed_value string, suite_duration_s double")
    return spark.createDataFrame(rows, schema).withColumn("validated_at", F.current_timestamp())
