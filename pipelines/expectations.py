"""great-expectations 1.x on every micro-batch, down to the failing rows.

The suite declared in the YAML is built once, before the query starts (an unknown expectation
or bad arguments fail fast, naming `expectations.rules[i]`). Each batch is validated as a
whole-DataFrame batch of an ephemeral context's Spark datasource, with result format COMPLETE
and `(_topic, _offset)` as the unexpected-index columns: every column-map expectation then
names the exact messages it rejected, and those rows go to quarantine with the names of the
expectations they failed. Table-level expectations (row counts, ...) can only fail a batch as
a whole: their results are logged and kept in the metrics, no row is blamed for them.

Which engine runs the suite (`QualityGate.validate`): great-expectations' Spark engine costs
0.8-1.3 s per micro-batch for three column-map expectations on this machine whatever the batch's
size (one Spark job or more per metric), more than the 500 ms trigger. A batch of at most
`pandas_max_rows` decodable rows is therefore collected once as Arrow (only the index columns
and the columns the rules read) and validated by great-expectations' pandas engine (~0.1 s),
but only where both engines give the same verdict on every row (`pandas_safe`): the
expectation is one of `_PANDAS_RULES` with only the keyword arguments listed there, its
column is a string, boolean, integral or floating-point column, its bounds or value set have
the column's kind, and a floating-point column holds no NaN (Spark counts NaN as a value,
pandas as a null). Anything else, and every larger batch, runs on the Spark engine. Either
way great-expectations computes the results, the unexpected-index lists and so the
`_failed_expectations` of each row; `BatchQuality.engine` says which engine it was.

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

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from danube_core.errors import ConfigError
from pipelines.config import ExpectationRule, ExpectationsConfig
from pipelines.expressions import ExpressionCache

logger = logging.getLogger(__name__)

FAILED = "_failed_expectations"
INDEX_COLUMNS = ["_topic", "_offset"]
PANDAS_MAX_ROWS = 50_000  # a batch this small collects in well under a trigger interval
LITERAL_FAILURES = 256  # failing rows marked through a literal map rather than a broadcast join
_KEY_SEPARATOR = "\u0000"  # between topic and offset in that map's keys; no topic name holds it
EXACT_INT = 2**53  # beyond it the Spark engine's comparisons (through doubles) and pandas' (exact) differ
_COMMON_KWARGS = frozenset({"column", "mostly", "meta", "notes"})
# expectation type -> the keyword arguments besides the common ones whose meaning both engines share
_PANDAS_RULES = {
    "expect_column_values_to_not_be_null": frozenset(),
    "expect_column_values_to_be_null": frozenset(),
    "expect_column_values_to_be_between": frozenset({"min_value", "max_value", "strict_min", "strict_max"}),
    "expect_column_values_to_be_in_set": frozenset({"value_set"}),
    "expect_column_values_to_not_be_in_set": frozenset({"value_set"}),
}


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
    engine: str = "spark"


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

    def __init__(self, config: ExpectationsConfig, pandas_max_rows: int = PANDAS_MAX_ROWS) -> None:
        os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
        import great_expectations as gx

        self.config = config
        self.pandas_max_rows = pandas_max_rows
        self.names = [rule_name(rule) for rule in config.rules]
        self._context = gx.get_context(mode="ephemeral")
        self._disable_progress_bars()
        datasource = self._context.data_sources.add_spark(name="danube_batches", persist=False)
        self._batches = datasource.add_dataframe_asset(name="micro_batch").add_batch_definition_whole_dataframe("batch")
        frames = self._context.data_sources.add_pandas(name="danube_small_batches")
        self._frames = frames.add_dataframe_asset(name="micro_batch").add_batch_definition_whole_dataframe("batch")
        self.suite = gx.ExpectationSuite(name=config.suite)
        for i, rule in enumerate(config.rules):
            self.suite.add_expectation(self._expectation(gx, rule, i))

    def pandas_columns(self, rows: DataFrame) -> list[str] | None:
        """The columns a pandas-engine run of the suite reads from `rows`; None when the suite
        cannot run on the pandas engine for this schema (`pandas_safe`)."""
        return suite_columns(self.config.rules) if pandas_safe(self.config.rules, rows) else None

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

    def validate(self, rows: DataFrame, row_count: int | None = None, collected: Any = None) -> BatchQuality:
        """Validate one (cached) batch; the failing rows' ids come back with their rule names.

        `row_count` (the decodable rows, when the caller knows it without a Spark job) lets a
        small batch run on the pandas engine (module doc); without it the Spark engine runs.
        `collected`: those rows' `pandas_columns` as an Arrow table, when the caller collected
        them already (in the same pass as its own summary), so no job collects them again."""
        started = time.monotonic()
        engine, data = "spark", rows
        if row_count is not None and row_count <= self.pandas_max_rows and pandas_safe(self.config.rules, rows):
            frame = pandas_frame(rows, self.config.rules) if collected is None else checked_frame(collected)
            if frame is not None:
                engine, data = "pandas", frame
        definition = self._frames if engine == "pandas" else self._batches
        batch = definition.get_batch(batch_parameters={"dataframe": data})
        result = batch.validate(
            self.suite,
            result_format={"result_format": "COMPLETE", "unexpected_index_column_names": INDEX_COLUMNS},
        )
        outcomes: list[ExpectationOutcome] = []
        failed: dict[tuple[str, int], tuple[str, ...]] = {}
        for res in result.results:
            config = res.expectation_config
            assert config is not None, "a suite's validation result names the expectation it ran"
            name = rule_name(ExpectationRule(config.type, dict(config.kwargs)))
            details = res.result or {}
            outcomes.append(ExpectationOutcome(name, bool(res.success), details.get("element_count"),
                                               details.get("unexpected_count"), details.get("observed_value")))
            for index in details.get("unexpected_index_list") or []:
                key = (index["_topic"], int(index["_offset"]))
                failed[key] = failed.get(key, ()) + (name,)
        quality = BatchQuality(self.config.suite, bool(result.success), tuple(outcomes), failed,
                               time.monotonic() - started, engine)
        _log(quality)
        return quality


def _kind(data_type: Any) -> str | None:
    """The kind of a Spark column both engines compare alike, None for any other type."""
    from pyspark.sql import types as T

    if isinstance(data_type, T.StringType):
        return "string"
    if isinstance(data_type, T.BooleanType):
        return "boolean"
    if isinstance(data_type, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
        return "integral"
    if isinstance(data_type, (T.FloatType, T.DoubleType)):
        return "floating"
    return None


def _value_kind(value: Any) -> str | None:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integral"
    if isinstance(value, float):
        return "floating"
    if isinstance(value, str):
        return "string"
    return None


def _values_fit(kind: str, values: list) -> bool:
    """Bounds / set members of a kind the column's values compare with the same way in both engines."""
    numeric = {"integral", "floating"}
    for value in values:
        found = _value_kind(value)
        if found != kind and not (kind in numeric and found in numeric):
            return False
        if found == "integral" and abs(value) > EXACT_INT:
            return False
    return True


def pandas_safe(rules: tuple[ExpectationRule, ...] | list[ExpectationRule], rows: DataFrame) -> bool:
    """True when great-expectations' pandas engine gives every rule the Spark engine's verdicts on `rows`
    (NaN in floating-point columns is checked later, on the collected data: `pandas_frame`)."""
    types = {field.name: field.dataType for field in rows.schema.fields}
    if any(column not in types for column in INDEX_COLUMNS):
        return False
    for rule in rules:
        allowed = _PANDAS_RULES.get(rule.type)
        if allowed is None or not set(rule.kwargs) <= allowed | _COMMON_KWARGS:
            return False
        column = rule.kwargs.get("column")
        kind = _kind(types[column]) if column in types else None
        if kind is None:
            return False
        if rule.type.endswith("_be_between"):
            bounds = [rule.kwargs[k] for k in ("min_value", "max_value") if rule.kwargs.get(k) is not None]
            if kind not in ("integral", "floating") or not _values_fit(kind, bounds):
                return False
            if any(not isinstance(rule.kwargs.get(k, False), bool) for k in ("strict_min", "strict_max")):
                return False
        if "value_set" in allowed:
            values = rule.kwargs.get("value_set")
            if not isinstance(values, (list, tuple, set)) or None in values or not _values_fit(kind, list(values)):
                return False
    return True


def suite_columns(rules: tuple[ExpectationRule, ...] | list[ExpectationRule]) -> list[str]:
    """The index columns and the columns the rules read, in that order, each once."""
    return list(dict.fromkeys([*INDEX_COLUMNS, *(rule.kwargs["column"] for rule in rules)]))


def pandas_frame(rows: DataFrame, rules: tuple[ExpectationRule, ...] | list[ExpectationRule]) -> Any:
    """`suite_columns` of `rows` as pandas (one Spark job, via Arrow), or None (`checked_frame`)."""
    return checked_frame(rows.select(*suite_columns(rules)).toArrow())


def checked_frame(table: Any) -> Any:
    """An Arrow table of `suite_columns` as pandas, or None when a floating-point column holds a
    NaN (the pandas engine would take it for a null) or an integral column a value beyond
    2**53 (the Spark engine compares it as a double)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for name in table.column_names:
        column = table.column(name)
        if pa.types.is_floating(column.type) and pc.any(pc.is_nan(column)).as_py():
            return None
        if name not in INDEX_COLUMNS and pa.types.is_integer(column.type):
            low, high = pc.min_max(column).values()
            if any(v.as_py() is not None and abs(v.as_py()) > EXACT_INT for v in (low, high)):
                return None
    # integral columns with nulls stay Python ints (not floats), so large values compare exactly
    return table.to_pandas(integer_object_nulls=True)


def _log(quality: BatchQuality) -> None:
    for outcome in quality.outcomes:
        if not outcome.success:
            logger.warning("expectation %s failed: %s of %s rows unexpected (observed %r)", outcome.name,
                           outcome.unexpected_count, outcome.element_count, outcome.observed_value)
    logger.info("suite %s (%s engine): %s, %d failing rows, %.2fs", quality.suite, quality.engine,
                "passed" if quality.success else "failed", len(quality.failed_rows), quality.duration_s)


def no_failures() -> Column:
    """`_failed_expectations` of a row that failed none."""
    return F.array().cast("array<string>")


def mark_failures(spark: SparkSession, rows: DataFrame, quality: BatchQuality,
                  expressions: ExpressionCache | None = None) -> DataFrame:
    """`rows` with `_failed_expectations` (array of rule names, empty when the row passed).

    A few failing rows (at most `LITERAL_FAILURES`) are looked up in a literal map in the rows'
    own projection; more are joined from a broadcast frame. The join costs each write of the
    batch (target and quarantine) a Spark job to broadcast it."""
    cache = ExpressionCache.given(expressions)
    empty = cache.get("no failures", no_failures)
    if not quality.failed_rows:
        return rows.withColumn(FAILED, empty)
    if len(quality.failed_rows) <= LITERAL_FAILURES:
        key = cache.get("row key", lambda: F.concat_ws(_KEY_SEPARATOR, F.col("_topic"), F.col("_offset").cast("string")))
        entries = [part for (topic, offset), names in quality.failed_rows.items()
                   for part in (F.lit(f"{topic}{_KEY_SEPARATOR}{offset}"), F.array(*[F.lit(n) for n in names]))]
        return rows.withColumn(FAILED, F.coalesce(F.create_map(*entries)[key], empty))
    failures = spark.createDataFrame(
        [(topic, offset, list(names)) for (topic, offset), names in quality.failed_rows.items()],
        "_topic string, _offset long, _failed array<string>",
    )
    joined = rows.join(F.broadcast(failures), on=INDEX_COLUMNS, how="left")
    return joined.withColumn(FAILED, F.coalesce(F.col("_failed"), empty)).drop("_failed")
