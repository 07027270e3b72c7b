"""A tail read split into the pipeline's target rows without Spark, where that gives Spark's rows exactly.

The pipeline decodes with Spark's `from_json` and marks failures with great-expectations; run
per tail read, that costs 0.7-1.9 s of a local Spark session whatever the read's size (several
Spark jobs and a great-expectations run per read, measured with `bench/bench_tail.py`), so the
tail could never be fresher than the pipeline's own micro-batches. Most payloads are plain JSON
objects whose every field has exactly the declared scalar type; for those, what `from_json`
gives is not in doubt, and this module builds the same Arrow rows in Python. Every other
message is left to the Spark split (`pipelines.tail_feed`), so this is an optimisation, never a
second decoder with its own opinions.

A message is split here ("clean") only when all of these hold, else it goes to Spark:

* the pipeline decodes JSON with one schema: an inline one, or a registry subject with exactly
  one version (with several, Spark's union of per-version parts decides the columns);
* the schema's top-level properties are all `string`, `integer`, `number` or `boolean` columns;
* the payload is UTF-8, strict JSON (no NaN/Infinity, no duplicate key, nothing after the
  object), an object with no key the schema does not name, every value null or of the exact
  type (`integer`: an int within int64; `number`: a finite float or an int within 2**53;
  `boolean` is not an int here), every required field present and not null;
* the row names no other schema version than the subject's one (rows naming another are
  quarantined by the pipeline and dropped here: exactly Spark's verdict).

Such a row decodes to its fields, `_rescued_data` null and no decode error, as in Spark. Under
`on_error: quarantine` a few payloads are also decided here, as decode errors (not target rows):
null or empty, text no JSON value can start with even under Spark's lenient options (a word that
is no JSON keyword, as in `this is not json`), and an object that would be clean but lacks a
required field; a topic with such messages (the demo publishes them) keeps its reads off Spark.
Expectations are checked by `pipelines.tail_rules` where great-expectations' pandas engine is
what the pipeline itself runs (`expectations.pandas_safe`); any other suite sends the whole read
to Spark.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from pipelines.tail_rules import compile_rules

KINDS = {"StringType": "string", "LongType": "integer", "DoubleType": "number", "BooleanType": "boolean"}
ARROW_TYPES = {"string": pa.string(), "integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_()}
INT64 = 2**63
EXACT_DOUBLE_INT = 2**53  # an int beyond it in a `number` field: Spark's rounding is not checked here
_META = ("_topic", "_partition", "_offset", "_publish_time", "_producer_name", "_schema_id",
         "_schema_version", "_source", "_attributes")


@dataclass(frozen=True)
class FlatSchema:
    """A JSON payload schema of scalar top-level fields: (name, kind) in the schema's order."""

    fields: tuple[tuple[str, str], ...]
    required: frozenset[str]

    @property
    def names(self) -> frozenset[str]:
        return frozenset(name for name, _ in self.fields)


class _Unclean(Exception):
    """This payload is left to Spark."""


def flat_schema(struct: Any, required: Sequence[str]) -> FlatSchema | None:
    """The schema's fields when they are all scalars `from_json` types plainly, else None."""
    fields = []
    for field in struct.fields:
        kind = KINDS.get(type(field.dataType).__name__)
        if kind is None:
            return None
        fields.append((field.name, kind))
    return FlatSchema(tuple(fields), frozenset(required))


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        raise _Unclean("duplicate key")
    return found


def _constant(name: str) -> Any:
    raise _Unclean(name)


def _value(value: Any, kind: str) -> Any:
    kind_of = type(value)
    if value is None:
        return None
    if kind == "string" and kind_of is str:
        return value
    if kind == "boolean" and kind_of is bool:
        return value
    if kind == "integer" and kind_of is int and -INT64 <= value < INT64:
        return value
    if kind == "number" and ((kind_of is float and math.isfinite(value))
                             or (kind_of is int and abs(value) <= EXACT_DOUBLE_INT)):
        return float(value)
    raise _Unclean(kind)


class _Quarantined(tuple):
    """`parse_clean`'s answer for a payload the pipeline certainly quarantines (a decode error)."""


QUARANTINED = _Quarantined()
# What a JSON value can start with under Spark's JSON options (single quotes and NaN/Infinity are
# allowed there, comments and leading '+'/'.' are not, but they are kept here to stay on the safe side).
_VALUE_STARTS = frozenset("{[\"'0123456789-+./#")
_KEYWORDS = frozenset({"true", "false", "null", "NaN", "Infinity"})
_WORD = re.compile(r"[A-Za-z]*")


def parse_clean(payload: bytes | None, schema: FlatSchema, quarantine: bool = False) -> tuple | None:
    """The payload's field values in the schema's order; None when it is not clean (Spark decides).

    With `quarantine` (the pipeline's `on_error: quarantine`), `QUARANTINED` for a payload whose
    decode certainly fails in Spark too: null or empty, text no JSON value can start with (a word
    that is no JSON keyword), or a clean object without a required field."""
    if not payload:
        return QUARANTINED if quarantine else None
    try:
        text = payload.decode("utf-8")
        found = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant)
        if type(found) is not dict or not found.keys() <= schema.names:
            return None
        values = tuple(_value(found.get(name), kind) for name, kind in schema.fields)
    except UnicodeDecodeError:
        return None
    except ValueError:  # not JSON to Python: to Spark's more lenient parser too when it cannot start a value
        return QUARANTINED if quarantine and _no_json_value(text) else None
    except (_Unclean, RecursionError):
        return None
    if any(kind == "string" and v is not None and not _utf8(v) for (_, kind), v in zip(schema.fields, values)):
        return None
    if any(found.get(name) is None for name in schema.required):
        # Spark parses the same struct, with the field null: "missing required field(s)"
        return QUARANTINED if quarantine else None
    return values


def _no_json_value(text: str) -> bool:
    """True when `text` cannot start any JSON value, however leniently read."""
    body = text.lstrip(" \t\n\r")
    if not body or body[0] in _VALUE_STARTS:
        return False
    word = _WORD.match(body)
    return word is not None and word.group() != "" and not any(word.group().startswith(k) for k in _KEYWORDS)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a \\ud800 escape
        return False
    return True


@dataclass(frozen=True)
class SplitPlan:
    """How this read's rows decode: the schema, and which rows are the subject's one version
    (`schema_id`/`version`; both None for an inline schema: every row is)."""

    schema: FlatSchema
    schema_id: int | None
    version: int | None
    quarantine: bool = True  # `on_error: quarantine`: a payload that does not decode is not a target row


def split_plan(decoder: Any) -> SplitPlan | None:
    """The plan for `decoder`'s next read, None when its reads are left to Spark."""
    from pipelines.decode import PayloadSchema

    if decoder.config.format != "json":
        return None
    if decoder.schemas is None:
        payload, schema_id, version = decoder.inline_schema(), None, None
    else:
        meta = decoder.schemas.subject_metadata()
        schema_id = meta.id
        version = decoder.config.version or meta.latest_version
        known = {v.version for v in meta.versions} | decoder.schemas.loaded_versions() | {version}
        if len(known) != 1:
            return None
        payload = decoder.version_schema(version)
        if not isinstance(payload, PayloadSchema):
            return None
    try:
        parsed = decoder.json_schema(payload)
    except Exception:  # the Spark path reports it the pipeline's way
        return None
    schema = flat_schema(parsed.struct, parsed.required)
    return None if schema is None else SplitPlan(schema, schema_id, version, decoder.config.on_error == "quarantine")


def _meta_columns(batch: pa.RecordBatch) -> list[pa.Array]:
    """`Decoder.prepare`'s metadata columns from the connector's columns."""
    topic, partition = batch.column("topic"), batch.column("partition")
    named = pc.binary_join_element_wise(topic, pc.cast(partition, pa.string()), "-part-")
    return [
        pc.if_else(pc.is_null(partition), topic, named),
        partition,
        batch.column("offset"),
        batch.column("publish_time"),
        batch.column("producer_name"),
        pc.cast(batch.column("schema_id"), pa.int64()),
        batch.column("schema_version"),
        batch.column("source") if "source" in batch.schema.names else pa.nulls(batch.num_rows, pa.string()),
        batch.column("attributes"),
    ]


class ArrowSplit:
    """Splits the clean messages of a read; `split` returns (their target rows, the rest for Spark)."""

    def __init__(self, decoder: Any, rules: Sequence[Any] | None) -> None:
        self.decoder = decoder
        self.rules = rules

    def split(self, batches: list[pa.RecordBatch]) -> tuple[pa.Table | None, list[pa.RecordBatch]]:
        """(target rows of the clean messages, or None when none were split here; the batches
        of the messages left to Spark)."""
        plan = split_plan(self.decoder)
        checks = None
        if plan is not None and self.rules is not None:
            checks = compile_rules(self.rules, dict(plan.schema.fields))
            if checks is None:
                plan = None
        if plan is None:
            return None, batches
        tables, rest = [], []
        try:
            for batch in batches:
                rows, left = self._split_batch(batch, plan)
                tables.append(rows)
                if left.num_rows:
                    rest.append(left)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # e.g. a schema id beyond int64
            return None, batches
        rows = pa.concat_tables(tables)
        if checks is not None:
            if not checks.exact(rows):
                return None, batches
            rows = rows.filter(checks.passing(rows))
        return rows, rest

    @staticmethod
    def _split_batch(batch: pa.RecordBatch, plan: SplitPlan) -> tuple[pa.Table, pa.RecordBatch]:
        """(the decoded clean rows of `batch`, its rows left to Spark)."""
        schema = plan.schema
        version_ok = ArrowSplit._version_mask(batch, plan)
        payloads = batch.column("payload").to_pylist()
        quarantine = plan.quarantine
        parsed = [parse_clean(p, schema, quarantine) if ok else QUARANTINED for p, ok in zip(payloads, version_ok)]
        clean = pa.array([v is not None and v is not QUARANTINED for v in parsed], pa.bool_())
        # rows of another version, and payloads certainly not decoding, are the pipeline's quarantine
        unclean = pa.array([v is None for v in parsed], pa.bool_())
        values = [v for v in parsed if v is not None and v is not QUARANTINED]
        meta = pa.Table.from_arrays(_meta_columns(batch), names=list(_META)).filter(clean)
        columns = [pa.array([v[i] for v in values], ARROW_TYPES[kind]) for i, (_, kind) in enumerate(schema.fields)]
        rows = meta
        for (name, _), column in zip(schema.fields, columns):
            rows = rows.append_column(name, column)
        rows = rows.append_column("_rescued_data", pa.nulls(rows.num_rows, pa.string()))
        return rows, batch.filter(unclean)

    @staticmethod
    def _version_mask(batch: pa.RecordBatch, plan: SplitPlan) -> list[bool]:
        """Per row, whether it decodes with the plan's version (`Decoder`'s row version rule)."""
        if plan.schema_id is None:
            return [True] * batch.num_rows
        ids = pc.cast(batch.column("schema_id"), pa.int64()).to_pylist()
        versions = batch.column("schema_version").to_pylist()
        return [(v if (i == plan.schema_id and v is not None) else plan.version) == plan.version
                for i, v in zip(ids, versions)]
