"""The pipeline's expectations on a tail read's rows, without great-expectations or Spark.

Only for suites great-expectations' pandas engine runs for the pipeline itself
(`pipelines.expectations.pandas_safe`: five column-map expectations, scalar columns, bounds and
sets of the column's kind), whose verdict per row is plain: `not_be_null` fails a null,
`be_null` a value, and the other three ignore nulls and fail a value outside the bounds
(inclusive unless `strict_min`/`strict_max`), outside the set, or in the set. `mostly` changes
whether the expectation passes, not which rows it names, and the pipeline quarantines every row
named. Values beyond 2**53 in an integral column are left to the pipeline's engines (`exact`).
Running great-expectations itself costs 70-180 ms per read; this costs well under a millisecond
for a few hundred rows. tests/unit/test_tail_rules.py checks it against great-expectations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import pyarrow as pa

from pipelines.expectations import _COMMON_KWARGS, _PANDAS_RULES, EXACT_INT, _values_fit

# a tail_split field kind -> expectations' column kind
COLUMN_KINDS = {"string": "string", "integer": "integral", "number": "floating", "boolean": "boolean"}
Check = Callable[[Any], bool]  # a row's value (None: null) -> True when the row fails the rule


def _between(rule: Mapping[str, Any]) -> Check | None:
    low, high = rule.get("min_value"), rule.get("max_value")
    if low is None and high is None or (low is not None and high is not None and low > high):
        return None  # great-expectations refuses these: left to it
    strict_low, strict_high = bool(rule.get("strict_min", False)), bool(rule.get("strict_max", False))

    def fails(v: Any) -> bool:
        if v is None:
            return False
        if low is not None and (v < low or (strict_low and v == low)):
            return True
        return high is not None and (v > high or (strict_high and v == high))
    return fails


def _check(kind: str, rule: Mapping[str, Any]) -> Check | None:
    if kind == "expect_column_values_to_not_be_null":
        return lambda v: v is None
    if kind == "expect_column_values_to_be_null":
        return lambda v: v is not None
    if kind == "expect_column_values_to_be_between":
        return _between(rule)
    members = list(rule["value_set"])
    if kind == "expect_column_values_to_be_in_set":
        return lambda v: v is not None and v not in members
    return lambda v: v is not None and v in members


@dataclass(frozen=True)
class CompiledRules:
    """The suite as (column, check) pairs; `integral`: the columns whose values must stay exact."""

    checks: tuple[tuple[str, Check], ...]
    integral: tuple[str, ...]

    def exact(self, rows: pa.Table) -> bool:
        """False when an integral rule column holds a value the engines compare through doubles."""
        for name in self.integral:
            if any(v is not None and abs(v) > EXACT_INT for v in rows.column(name).to_pylist()):
                return False
        return True

    def passing(self, rows: pa.Table) -> pa.Array:
        """Per row, True when it fails none of the rules."""
        ok = [True] * rows.num_rows
        for name, fails in self.checks:
            for i, value in enumerate(rows.column(name).to_pylist()):
                if ok[i] and fails(value):
                    ok[i] = False
        return pa.array(ok, pa.bool_())


def compile_rules(rules: Sequence[Any], kinds: Mapping[str, str]) -> CompiledRules | None:
    """The rules (`ExpectationRule`s) over columns of `kinds` (tail_split kinds), or None when any
    of them is not one the pandas engine would run for the pipeline (`expectations.pandas_safe`)."""
    checks, integral = [], []
    for rule in rules:
        allowed = _PANDAS_RULES.get(rule.type)
        if allowed is None or not set(rule.kwargs) <= allowed | _COMMON_KWARGS:
            return None
        column = rule.kwargs.get("column")
        kind = COLUMN_KINDS.get(kinds.get(column, ""))
        if kind is None:
            return None
        if rule.type.endswith("_be_between"):
            bounds = [rule.kwargs[k] for k in ("min_value", "max_value") if rule.kwargs.get(k) is not None]
            if kind not in ("integral", "floating") or not _values_fit(kind, bounds):
                return None
            if any(not isinstance(rule.kwargs.get(k, False), bool) for k in ("strict_min", "strict_max")):
                return None
        if "value_set" in allowed:
            values = rule.kwargs.get("value_set")
            if not isinstance(values, (list, tuple, set)) or None in values or not _values_fit(kind, list(values)):
                return None
        check = _check(rule.type, rule.kwargs)
        if check is None:
            return None
        checks.append((column, check))
        if kind == "integral":
            integral.append(column)
    return CompiledRules(tuple(checks), tuple(dict.fromkeys(integral)))
