"""What one decoded micro-batch holds: offset spans per topic partition, objects read, decode failures.

The sink needs this before it writes (each commit's `userMetadata` names the offsets and
objects; the planned ranges minus the rows held are the offsets lost), and it is computed in
the pass that reads the batch and fills its cache, as metrics observed by Spark
(`Observation`) rather than by a group-by: a shuffle, which adaptive execution runs as three
Spark jobs, was a sizeable part of a micro-batch of a few thousand rows. For a batch small
enough for great-expectations' pandas engine, that same pass also collects what the suite
reads (`summarize_and_collect`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Collection, Mapping

from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F

from pipelines.checkpoint_state import PlannedRange
from pipelines.decode import DECODE_ERROR
from pipelines.expectations import BatchQuality, QualityGate
from pipelines.expressions import ExpressionCache
from pipelines.metrics import OffsetSpan

DECODE_REASON = "decode"  # the quarantine reason of a payload that did not decode (as the metrics' label)


@dataclass(frozen=True)
class BatchSummary:
    """What one pass over a decoded batch tells: offset spans and undecodable rows."""

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

    def quarantine_reasons(self, quality: BatchQuality | None) -> dict[str, int]:
        """Rows quarantined by reason: `DECODE_REASON` for payloads that did not decode, else the
        expectations a row failed joined with " & " (its `_failed_expectations`, in order).

        From what the batch already holds (the decode failures observed, great-expectations'
        failing rows on the driver), so it costs no Spark job; the decode error's own text stays
        in the quarantine table, since counting by it would take a group-by over the batch."""
        reasons: dict[str, int] = {DECODE_REASON: self.decode_failures} if self.decode_failures else {}
        for names in (quality.failed_rows.values() if quality is not None else ()):
            reason = " & ".join(names) or "expectations"
            reasons[reason] = reasons.get(reason, 0) + 1
        return reasons


def summarize(decoded: DataFrame, topics: Collection[str] | None = None,
              expressions: ExpressionCache | None = None) -> BatchSummary:
    """Per topic partition: first offset, end (last + 1), row count, objects read; and decode failures.

    With the batch's topic partitions known (its planned ranges), the summary is computed as
    metrics observed while a no-op write runs the batch once (`Observation`): one Spark job, no
    shuffle, and the same pass fills the cache of `decoded`. A group-by costs a shuffle, which
    adaptive execution runs as three jobs; on a micro-batch of a few thousand rows those jobs
    were a sizeable part of the batch's time. Rows of a topic partition outside `topics` (or no
    `topics`) fall back to the group-by. `expressions`: the query's cache of the metrics' columns
    (`pipelines.expressions`)."""
    if topics:
        observation, metrics = _summary_metrics(topics, ExpressionCache.given(expressions))
        decoded.observe(observation, *metrics).write.format("noop").mode("overwrite").save()
        observed = _observed_summary(observation.get, topics)
        if observed is not None:
            return observed
    rows = decoded.groupBy("_topic").agg(
        F.min("_offset").alias("first"), F.max("_offset").alias("last"), F.count(F.lit(1)).alias("rows"),
        F.array_sort(F.collect_set("_source")).alias("sources"),
        F.count(F.col(DECODE_ERROR)).alias("undecodable"),
    ).collect()
    spans = {r["_topic"]: OffsetSpan(r["first"], r["last"] + 1, r["rows"], tuple(r["sources"] or ())) for r in rows}
    return BatchSummary(spans, sum(r["undecodable"] for r in rows))


def summarize_and_collect(decoded: DataFrame, topics: Collection[str], columns: list[str],
                          expressions: ExpressionCache | None = None) -> tuple[BatchSummary, Any]:
    """`summarize`, and `columns` of the decodable rows as an Arrow table, from one Spark job.

    For a small batch validated on great-expectations' pandas engine: the summary is observed
    while the same pass collects what the suite reads, so the batch is read once and collected
    once (the group-by fallback of `summarize` applies, in a second job)."""
    cache = ExpressionCache.given(expressions)
    observation, metrics = _summary_metrics(topics, cache)
    decodable = decoded.observe(observation, *metrics).filter(cache.get("decodable", decodable_rows))
    collected = decodable.select(*cache.get(("columns", *columns), lambda: [F.col(c) for c in columns])).toArrow()
    summary = _observed_summary(observation.get, topics)
    return (summary if summary is not None else summarize(decoded)), collected


SOURCES_SEPARATOR = "\n"  # between a batch's sources (object ids, "wal"), which never hold one


def decodable_rows() -> Column:
    """The condition that keeps the rows that decoded."""
    return F.col(DECODE_ERROR).isNull()


def _summary_metrics(topics: Collection[str], expressions: ExpressionCache) -> tuple[Observation, list[Column]]:
    """A new observation and the metrics `_observed_summary` reads, for the named topic partitions
    (the metrics' columns built once per set of topic partitions)."""
    named = tuple(sorted(topics))

    def build() -> list[Column]:
        metrics = [F.count(F.lit(1)).alias("rows"), F.count(F.col(DECODE_ERROR)).alias("undecodable")]
        for i, topic in enumerate(named):
            mine = F.col("_topic") == F.lit(topic)
            metrics += [
                F.min(F.when(mine, F.col("_offset"))).alias(f"first_{i}"),
                F.max(F.when(mine, F.col("_offset"))).alias(f"last_{i}"),
                F.count(F.when(mine, F.lit(1))).alias(f"rows_{i}"),
                # Joined into one string: PySpark 4.0's Observation returns an array metric as an
                # unconverted Java object; a string reads the same on every Spark.
                F.array_join(F.collect_set(F.when(mine, F.col("_source"))), SOURCES_SEPARATOR).alias(f"sources_{i}"),
            ]
        return metrics

    return Observation(f"danube_batch_summary_{uuid.uuid4().hex}"), expressions.get(("summary", named), build)


def _observed_summary(found: Mapping[str, Any], topics: Collection[str]) -> BatchSummary | None:
    """The summary from `_summary_metrics`' values; None when the batch holds rows of other topics."""
    spans = {topic: OffsetSpan(found[f"first_{i}"], found[f"last_{i}"] + 1, found[f"rows_{i}"],
                               tuple(sorted(filter(None, found[f"sources_{i}"].split(SOURCES_SEPARATOR)))))
             for i, topic in enumerate(sorted(topics)) if found[f"rows_{i}"]}
    if sum(span.rows for span in spans.values()) != found["rows"]:
        return None
    return BatchSummary(spans, found["undecodable"])


def collected_columns(gate: QualityGate | None, decoded: DataFrame,
                      planned: Mapping[str, PlannedRange] | None) -> list[str] | None:
    """What to collect with the batch's summary for the pandas engine, or None: only for a batch
    whose planned ranges bound it within the gate's `pandas_max_rows`."""
    if gate is None or not planned or any(rng.start is None for rng in planned.values()):
        return None
    if sum(rng.end - rng.start for rng in planned.values() if rng.start is not None) > gate.pandas_max_rows:
        return None
    return gate.pandas_columns(decoded)
