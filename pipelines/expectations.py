"""great-expectations 1.x on every micro-batch, with its Spark engine, down to the failing rows.

The suite declared in the YAML is built once, before the query starts (an unknown expectation
or bad arguments fail fast, naming `expectations.rules[i]`). Each batch is validated as a
whole-DataFrame batch of an ephemeral context's Spark datasource, with result format COMPLETE
and `(_topic, _offset)` as the unexpected-index columns: every column-map expectation then
names the exact messages it rejected, and those rows go to quarantine with the names of the
expectations they failed. Table-level expectations (row counts, ...) can only fail a batch as
a whole: their results are logged and kept in the metrics, no row is blamed for them.

Checked on pyspark 4.2 with great-expectations 1.24.1 installed without its `[spark]` extra:
the Spark datasource, batch definitions and unexpected-index lists all work unchanged. Two
settings matter: usage statistics are off (no network from a pipeline) and the datasource
does not persist the frame itself (the sink already caches each batch once).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Mapping

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from danube_core.errors import ConfigError
from pipelines.config import ExpectationRule, ExpectationsConfig

logger = logging.getLogger(__name__)

FAILED = "_failed_expectations"
INDEX_COLUMNS = ["_topic", "_offset"]


@dataclass(frozen=True)
class ExpectationOutcome:
    """One expectation on one batch."""

    name: str
    success: bool
    element_count: int | None
    unexpected_count: int | None
    observed_value: Any = None


@dataclass(frozen=True)
class BatchQuality:
    """The suite's verdict on one batch and how long great-expectations took."""

    suite: str
    success: bool
    outcomes: tuple[ExpectationOutcome, ...]
    failed_rows: Mapping[tuple[str, int], tuple[str, ...]]
    duration_s: float


def rule_name(rule: ExpectationRule) -> str:
    """The name quarantined rows carry: the expectation type and its column(s)."""
    columns = [str(rule.kwargs[k]) for k in ("column", "column_A", "column_B") if k in rule.kwargs]
    if "column_list" in rule.kwargs:
        columns.append("+".join(map(str, rule.kwargs["column_list"])))
    return f"{rule.type}({', '.join(columns)})" if columns else rule.type


def _class_name(snake: str) -> str:
    return "".join(part.capitalize() for part in snake.split("_"))


class QualityGate:
    """Runs the configured suite on batches; one ephemeral GE context per pipeline."""

    def __init__(self, config: ExpectationsConfig) -> None:
        os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
        import great_expectations as gx

        self.config = config
        self.names = [rule_name(rule) for rule in config.rules]
        self._context = gx.get_context(mode="ephemeral")
        self._disable_progress_bars()
        datasource = self._context.data_sources.add_spark(name="danube_batches", persist=False)
        self._batches = datasource.add_dataframe_asset(name="micro_batch").add_batch_definition_whole_dataframe("batch")
        self.suite = gx.ExpectationSuite(name=config.suite)
        for i, rule in enumerate(config.rules):
            self.suite.add_expectation(self._expectation(gx, rule, i))

    def _disable_progress_bars(self) -> None:
        from great_expectations.data_context.types.base import ProgressBarsConfig

        self._context.variables.progress_bars = ProgressBarsConfig(globally=False)

    @staticmethod
    def _expectation(gx: Any, rule: ExpectationRule, i: int) -> Any:
        cls = getattr(gx.expectations, _class_name(rule.type), None)
        if cls is None:
            raise ConfigError(f"expectations.rules[{i}].type: great-expectations has no expectation {rule.type!r}")
        try:
            return cls(**rule.kwargs)
        except Exception as exc:  # pydantic ValidationError and friends: the kwargs are wrong
            raise ConfigError(f"expectations.rules[{i}].kwargs: invalid for {rule.type}: {exc}") from exc

    def validate(self, rows: DataFrame) -> BatchQuality:
        """Validate one (cached) batch; the failing rows' ids come back with their rule names."""
        started = time.monotonic()
        batch = self._batches.get_batch(batch_parameters={"dataframe": rows})
        result = batch.validate(
            self.suite,
            result_format={"result_format": "COMPLETE", "unexpected_index_column_names": INDEX_COLUMNS},
        )
        outcomes, failed = [], {}
        for res in result.results:
            config = res.expectation_config
            name = rule_name(ExpectationRule(config.type, dict(config.kwargs)))
            details = res.result or {}
            outcomes.append(ExpectationOutcome(name, bool(res.success), details.get("element_count"),
                                               details.get("unexpected_count"), details.get("observed_value")))
            for index in details.get("unexpected_index_list") or []:
                key = (index["_topic"], int(index["_offset"]))
                failed[key] = failed.get(key, ()) + (name,)
        quality = BatchQuality(self.config.suite, bool(result.success), tuple(outcomes), failed,
                               time.monotonic() - started)
        _log(quality)
        return quality


def _log(quality: BatchQuality) -> None:
    for outcome in quality.outcomes:
        if not outcome.success:
            logger.warning("expectation %s failed: %s of %s rows unexpected (observed %r)", outcome.name,
                           outcome.unexpected_count, outcome.element_count, outcome.observed_value)
    logger.info("suite %s: %s, %d failing rows, %.2fs", quality.suite, "passed" if quality.success else "failed",
                len(quality.failed_rows), quality.duration_s)


def mark_failures(spark: SparkSession, rows: DataFrame, quality: BatchQuality) -> DataFrame:
    """`rows` with `_failed_expectations` (array of rule names, empty when the row passed)."""
    empty = F.array().cast("array<string>")
    if not quality.failed_rows:
        return rows.withColumn(FAILED, empty)
    failures = spark.createDataFrame(
        [(topic, offset, list(names)) for (topic, offset), names in quality.failed_rows.items()],
        "_topic string, _offset long, _failed array<string>",
    )
    joined = rows.join(F.broadcast(failures), on=INDEX_COLUMNS, how="left")
    return joined.withColumn(FAILED, F.coalesce(F.col("_failed"), empty)).drop("_failed")
