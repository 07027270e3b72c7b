"""The tail's expectation checks (`pipelines.tail_rules`) fail exactly the rows great-expectations'
pandas engine names, for every rule kind it compiles; anything else is not compiled."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from pipelines.config import ExpectationRule
from pipelines.tail_rules import compile_rules

KINDS = {"amount": "number", "items": "integer", "currency": "string", "gift": "boolean"}
ROWS = pa.table({
    "_topic": ["/t"] * 10, "_offset": list(range(10)),
    "amount": [0.0, -0.5, 10.0, 10.5, None, 3.0, 1e-9, 9.999, -0.0, 2.0],
    "items": [1, 2, None, 0, 5, 7, -1, 3, 10, 4],
    "currency": ["EUR", "USD", None, "eur", "GBP", "EUR", "", "USD", "EUR", "XXX"],
    "gift": [True, False, None, True, True, False, None, False, True, True],
})
RULES = [
    ("expect_column_values_to_not_be_null", {"column": "amount"}),
    ("expect_column_values_to_not_be_null", {"column": "gift", "mostly": 0.5}),
    ("expect_column_values_to_be_null", {"column": "gift"}),
    ("expect_column_values_to_be_between", {"column": "amount", "min_value": 0, "max_value": 10}),
    ("expect_column_values_to_be_between", {"column": "amount", "min_value": 0.0, "strict_min": True}),
    ("expect_column_values_to_be_between", {"column": "items", "max_value": 5, "strict_max": True}),
    ("expect_column_values_to_be_between", {"column": "items", "min_value": 1, "max_value": 7.5}),
    ("expect_column_values_to_be_in_set", {"column": "currency", "value_set": ["EUR", "USD"]}),
    ("expect_column_values_to_be_in_set", {"column": "items", "value_set": [1, 2.0, 3]}),
    ("expect_column_values_to_not_be_in_set", {"column": "currency", "value_set": ["XXX", ""]}),
    ("expect_column_values_to_be_in_set", {"column": "gift", "value_set": [True]}),
]


@pytest.fixture(scope="module")
def ge_failures():
    """Rule -> the offsets great-expectations' pandas engine names, as the pipeline runs it."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    import great_expectations as gx

    from pipelines.expectations import INDEX_COLUMNS, _class_name, checked_frame

    context = gx.get_context(mode="ephemeral")
    batch = (context.data_sources.add_pandas(name="rules").add_dataframe_asset(name="rows")
             .add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": checked_frame(ROWS)}))
    found = {}
    for i, (kind, kwargs) in enumerate(RULES):
        suite = gx.ExpectationSuite(name=f"s{i}")
        suite.add_expectation(getattr(gx.expectations, _class_name(kind))(**kwargs))
        result = batch.validate(suite, result_format={"result_format": "COMPLETE",
                                                      "unexpected_index_column_names": INDEX_COLUMNS})
        found[i] = {int(x["_offset"]) for x in result.results[0].result.get("unexpected_index_list") or []}
    return found


@pytest.mark.parametrize("i", range(len(RULES)))
def test_each_rule_fails_the_rows_great_expectations_names(i, ge_failures):
    kind, kwargs = RULES[i]
    compiled = compile_rules([ExpectationRule(kind, kwargs)], KINDS)
    assert compiled is not None and compiled.exact(ROWS)
    passing = compiled.passing(ROWS).to_pylist()
    assert {o for o, ok in zip(ROWS["_offset"].to_pylist(), passing) if not ok} == ge_failures[i]


@pytest.mark.parametrize("kind, kwargs", [
    ("expect_column_values_to_match_regex", {"column": "currency", "regex": "E.*"}),
    ("expect_column_values_to_be_between", {"column": "currency", "min_value": "A"}),
    ("expect_column_values_to_be_between", {"column": "amount"}),
    ("expect_column_values_to_be_between", {"column": "amount", "min_value": 5, "max_value": 1}),
    ("expect_column_values_to_be_in_set", {"column": "currency", "value_set": ["EUR", None]}),
    ("expect_column_values_to_be_in_set", {"column": "items", "value_set": ["1"]}),
    ("expect_column_values_to_not_be_null", {"column": "nested"}),
    ("expect_table_row_count_to_be_between", {"min_value": 1}),
])
def test_rules_the_pandas_engine_would_not_run_are_left_to_spark(kind, kwargs):
    assert compile_rules([ExpectationRule(kind, kwargs)], {**KINDS, "nested": "struct"}) is None


def test_integral_values_past_2_53_are_left_to_the_engines():
    compiled = compile_rules([ExpectationRule("expect_column_values_to_be_between", {"column": "items", "min_value": 0})],
                             KINDS)
    assert compiled is not None
    assert not compiled.exact(pa.table({"items": [1, 2**53 + 1]}))
