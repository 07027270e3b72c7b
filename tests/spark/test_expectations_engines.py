"""great-expectations' pandas engine on small batches gives the Spark engine's verdicts, row by row.

`QualityGate.validate` runs a batch of at most `pandas_max_rows` decodable rows on the pandas
engine when every rule is one both engines read alike (`pipelines.expectations.pandas_safe`).
These tests validate the same rows with both engines and compare every outcome and every
failing row, and check which engine ran for each size and kind of rule.
"""

from __future__ import annotations

import math

import pytest

from pipelines.config import ExpectationRule, ExpectationsConfig
from pipelines import expectations
from pipelines.expectations import QualityGate, pandas_safe

SCHEMA = ("_topic string, _offset long, order_id string, amount double, qty long, paid boolean, "
          "currency string, note string")
RULES = (
    ExpectationRule("expect_column_values_to_not_be_null", {"column": "order_id"}),
    ExpectationRule("expect_column_values_to_be_between", {"column": "amount", "min_value": 0}),
    ExpectationRule("expect_column_values_to_be_between",
                    {"column": "qty", "min_value": 1, "max_value": 2**40, "strict_max": True}),
    ExpectationRule("expect_column_values_to_be_in_set", {"column": "currency", "value_set": ["EUR", "USD"]}),
    ExpectationRule("expect_column_values_to_not_be_in_set", {"column": "paid", "value_set": [False]}),
    ExpectationRule("expect_column_values_to_be_null", {"column": "note", "mostly": 0.5}),
)


def _rows(count: int) -> list[tuple]:
    rows = []
    for i in range(count):
        rows.append((
            "t-part-0" if i % 2 else "t-part-1", i,
            None if i % 11 == 0 else f"o{i}",
            None if i % 7 == 0 else (-0.5 if i % 5 == 0 else 0.0 if i % 3 == 0 else 1.5),
            None if i % 13 == 0 else (2**40 if i % 17 == 0 else 2**40 - 1 if i % 19 == 0 else i % 4),
            None if i % 6 == 0 else bool(i % 4),
            None if i % 9 == 0 else ("GBP" if i % 8 == 0 else "eur" if i % 10 == 0 else "EUR"),
            None if i % 3 else "n",
        ))
    return rows


def _verdicts(quality) -> tuple:
    outcomes = [(o.name, o.success, o.element_count, o.unexpected_count) for o in quality.outcomes]
    return outcomes, dict(quality.failed_rows), quality.success


def _gates(rules=RULES) -> tuple[QualityGate, QualityGate]:
    config = ExpectationsConfig("engines", rules)
    return QualityGate(config, pandas_max_rows=0), QualityGate(config, pandas_max_rows=10_000)


def test_the_pandas_engine_gives_the_spark_engines_verdicts(spark):
    rows = spark.createDataFrame(_rows(400), SCHEMA).cache()
    on_spark, on_pandas = _gates()
    by_spark = on_spark.validate(rows, 400)
    by_pandas = on_pandas.validate(rows, 400)
    assert (by_spark.engine, by_pandas.engine) == ("spark", "pandas")
    assert _verdicts(by_pandas) == _verdicts(by_spark)
    failed = by_spark.failed_rows
    # every rule rejected some rows, so the comparison covers each of them
    assert {name for names in failed.values() for name in names} == set(on_spark.names)
    assert "expect_column_values_to_be_between(qty)" in failed[("t-part-0", 17)]  # 2**40: strict max
    assert "expect_column_values_to_be_between(qty)" not in failed.get(("t-part-0", 19), ())  # 2**40 - 1


def test_the_engine_is_chosen_by_the_batch_size(spark):
    rows = spark.createDataFrame(_rows(50), SCHEMA)
    gate = QualityGate(ExpectationsConfig("engines", RULES), pandas_max_rows=50)
    assert gate.validate(rows, 50).engine == "pandas"
    assert gate.validate(rows, 51).engine == "spark"
    assert gate.validate(rows).engine == "spark"  # size unknown


def test_nan_in_a_checked_column_runs_on_the_spark_engine(spark):
    """Spark counts NaN as a value (not null, above every bound); pandas would take it for a null."""
    data = [("t", 0, "o0", math.nan, 1, True, "EUR", None), ("t", 1, None, 1.0, 1, True, "EUR", None)]
    rows = spark.createDataFrame(data, SCHEMA)
    on_spark, on_pandas = _gates(RULES[:2])
    by_pandas = on_pandas.validate(rows, 2)
    assert by_pandas.engine == "spark"
    assert _verdicts(by_pandas) == _verdicts(on_spark.validate(rows, 2))


def test_integers_beyond_2_53_run_on_the_spark_engine(spark):
    """The Spark engine compares 2**62 - 1 with a bound of 2**62 as doubles (equal); pandas exactly."""
    data = [("t", 0, "o0", 1.0, 2**62 - 1, True, "EUR", None), ("t", 1, "o1", 1.0, 1, True, "EUR", None)]
    rows = spark.createDataFrame(data, SCHEMA)
    rules = (ExpectationRule("expect_column_values_to_be_between", {"column": "qty", "min_value": 1}),)
    on_spark, on_pandas = _gates(rules)
    by_pandas = on_pandas.validate(rows, 2)
    assert by_pandas.engine == "spark"
    assert _verdicts(by_pandas) == _verdicts(on_spark.validate(rows, 2))


@pytest.mark.parametrize("rule", [
    ExpectationRule("expect_column_values_to_match_regex", {"column": "currency", "regex": "^E"}),
    ExpectationRule("expect_column_values_to_be_in_set", {"column": "qty", "value_set": ["1", "2"]}),
    ExpectationRule("expect_column_values_to_be_between", {"column": "currency", "min_value": "A"}),
    ExpectationRule("expect_column_values_to_not_be_null", {"column": "order_id", "row_condition": "qty>1"}),
    ExpectationRule("expect_table_row_count_to_be_between", {"min_value": 1}),
    ExpectationRule("expect_column_values_to_be_between", {"column": "qty", "max_value": 2**62}),
])
def test_rules_the_engines_read_differently_run_on_the_spark_engine(spark, rule):
    rows = spark.createDataFrame(_rows(20), SCHEMA)
    assert not pandas_safe((rule,), rows)
    assert pandas_safe(RULES, rows)


@pytest.mark.parametrize("literal_limit", [expectations.LITERAL_FAILURES, 0], ids=["literal-map", "broadcast-join"])
def test_failing_rows_are_marked_with_the_rules_they_failed(spark, monkeypatch, literal_limit):
    """A few failing rows are marked through a literal map, many through a broadcast join:
    both give every row exactly the names great-expectations gave it."""
    monkeypatch.setattr(expectations, "LITERAL_FAILURES", literal_limit)
    rows = spark.createDataFrame(_rows(200), SCHEMA).cache()
    quality = _gates()[1].validate(rows, 200)
    assert 0 < len(quality.failed_rows) <= expectations.LITERAL_FAILURES or literal_limit == 0
    marked = {(r["_topic"], r["_offset"]): tuple(r[expectations.FAILED])
              for r in expectations.mark_failures(spark, rows, quality).collect()}
    assert len(marked) == 200
    assert marked == {key: quality.failed_rows.get(key, ()) for key in marked}


def test_rows_collected_by_the_caller_give_the_same_verdicts(spark):
    """The sink may collect the suite's columns in its own pass (`collected`): the pandas engine
    then gives the verdicts it gives when it collects them itself, and a NaN in the collected
    table still sends the batch to the Spark engine."""
    rows = spark.createDataFrame(_rows(300), SCHEMA).cache()
    gate = _gates()[1]
    columns = gate.pandas_columns(rows)
    assert columns == ["_topic", "_offset", "order_id", "amount", "qty", "currency", "paid", "note"]
    collected = rows.select(*columns).toArrow()
    by_caller = gate.validate(rows, 300, collected)
    assert by_caller.engine == "pandas"
    assert _verdicts(by_caller) == _verdicts(gate.validate(rows, 300))
    with_nan = spark.createDataFrame([("t", 0, "o", math.nan, 1, True, "EUR", None)], SCHEMA)
    assert gate.validate(with_nan, 1, with_nan.select(*columns).toArrow()).engine == "spark"
    assert gate.pandas_columns(rows.withColumnRenamed("amount", "price")) is None  # a rule's column is gone
