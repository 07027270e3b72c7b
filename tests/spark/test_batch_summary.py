"""The sink's batch summary: offset spans, objects read and decode failures per topic partition.

`summarize` with the planned topic partitions observes its metrics in one pass, and
`summarize_and_collect` also collects the suite's columns in that pass; both must give what the
group-by gives, and fall back to it when the batch holds rows of a topic partition the plan does
not name.
"""

from __future__ import annotations

import pytest

import pipelines.batch_summary as batch_summary
from pipelines.batch_summary import summarize, summarize_and_collect
from pipelines.expressions import ExpressionCache

pytestmark = pytest.mark.spark

SCHEMA = "_topic string, _offset long, _source string, _decode_error string, amount double"


def _decoded(spark):
    rows = [("/t-part-0", o, f"obj-{o // 4}", "bad" if o % 5 == 0 else None, float(o)) for o in range(10, 30)]
    rows += [("/u", o, "wal", None, -1.0) for o in range(3, 6)]
    return spark.createDataFrame(rows, SCHEMA).persist()


def test_the_observed_summary_is_the_grouped_one(spark):
    decoded = _decoded(spark)
    grouped = summarize(decoded)
    assert dict(grouped.spans)["/t-part-0"].sources == ("obj-2", "obj-3", "obj-4", "obj-5", "obj-6", "obj-7")
    assert (grouped.rows, grouped.decode_failures) == (23, 4)
    assert summarize(decoded, ["/u", "/t-part-0"]) == grouped
    assert summarize(decoded, ["/t-part-0", "/u", "/v"]) == grouped  # a planned topic with no rows
    assert summarize(decoded, ["/t-part-0"]) == grouped  # rows of /u: the group-by again
    decoded.unpersist()


def test_the_summary_and_the_suites_columns_come_from_one_pass(spark):
    decoded = _decoded(spark)
    tracker, group = spark.sparkContext.statusTracker(), "summary-and-collect"
    spark.sparkContext.setJobGroup(group, group)
    try:
        summary, collected = summarize_and_collect(decoded, ["/t-part-0", "/u"], ["_topic", "_offset", "amount"])
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    assert len(tracker.getJobIdsForGroup(group)) == 1
    assert summary == summarize(decoded)
    assert collected.column_names == ["_topic", "_offset", "amount"]
    assert sorted(collected.column("_offset").to_pylist()) == [3, 4, 5] + [o for o in range(10, 30) if o % 5]
    fallback, again = summarize_and_collect(decoded, ["/u"], ["_offset"])
    assert fallback == summary and again.num_rows == collected.num_rows
    decoded.unpersist()


def test_a_querys_cache_builds_the_summary_columns_once(spark, monkeypatch):
    """Every batch of a query summarizes the same topic partitions: their metric columns (each
    `F.*` call a JVM round trip) are built by the first batch only, starting from the writer's
    empty cache."""
    decoded = _decoded(spark)
    cache = ExpressionCache()
    first = summarize(decoded, ["/u", "/t-part-0"], cache)
    built = []
    real = batch_summary.F.collect_set
    monkeypatch.setattr(batch_summary.F, "collect_set", lambda col: built.append(col) or real(col))
    assert summarize(decoded, ["/t-part-0", "/u"], cache) == first
    assert summarize_and_collect(decoded, ["/u", "/t-part-0"], ["_offset"], cache)[0] == first
    assert built == []
    assert summarize(decoded, ["/u"], cache) == first and built  # other topics: built for them (+ the group-by)
    decoded.unpersist()
