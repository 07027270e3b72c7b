"""The tail's Spark-free split gives exactly the Spark split's rows, and leaves to Spark every
message it cannot be sure of: the same read split both ways, compared column by column."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pyarrow as pa
import pytest

from connectors.schema import arrow_schema
from pipelines.config import DecodeConfig, ExpectationRule, ExpectationsConfig
from pipelines.decode import Decoder
from pipelines.expectations import QualityGate
from pipelines.tail_feed import spark_split
from pipelines.tail_split import ArrowSplit

pytestmark = pytest.mark.spark

SCHEMA = {"type": "object", "required": ["order_id"],
          "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"}, "currency": {"type": "string"},
                         "items": {"type": "integer"}, "gift": {"type": "boolean"}}}
RULES = (ExpectationRule("expect_column_values_to_not_be_null", {"column": "amount"}),
         ExpectationRule("expect_column_values_to_be_between", {"column": "amount", "min_value": 0, "max_value": 1000}),
         ExpectationRule("expect_column_values_to_be_in_set", {"column": "currency", "value_set": ["EUR", "USD"]}),
         ExpectationRule("expect_column_values_to_be_between", {"column": "items", "min_value": 1, "strict_min": True}))
CLEAN = [
    {"order_id": "a", "amount": 1.5, "currency": "EUR", "items": 2, "gift": True},
    {"order_id": "b", "amount": 7, "currency": None, "items": None},        # int for a number, nulls
    {"order_id": "c", "amount": 0.0, "currency": "USD", "items": 9},      # both bounds inclusive
    {"order_id": "d", "amount": -0.5, "currency": "EUR"},                 # fails between: dropped
    {"order_id": "e", "amount": 3.0, "currency": "GBP"},                  # fails in_set: dropped
    {"order_id": "f", "currency": "EUR"},                                 # fails not_null: dropped
    {"order_id": "g", "amount": 1.0, "items": 1},                         # fails strict_min: dropped
    {"order_id": "h\u00e9\u4e2d", "amount": 1000, "gift": False},
]
UNCLEAN = [
    b'{"order_id": "x", "amount": 1.0, "note": "extra"}',        # a key the schema does not name
    b'{"order_id": "x", "amount": "1.0"}',                       # a string for a number
    b'{"order_id": "x", "items": 1.0, "amount": 1}',             # a float for an integer
    b'{"order_id": "x", "amount": 1, "gift": 1}',                # an int for a boolean
    b'{"order_id": "x", "amount": NaN}',
    b'{"order_id": "x", "order_id": "y", "amount": 1}',          # a duplicate key
    b"{'order_id': 'x', 'amount': 1}",                           # single quotes (Spark reads them)
    b'{"order_id": "x", "amount": 1} trailing',
    b'[{"order_id": "x"}]',
    b'{not json',
    b'truest',                                                   # a keyword's start: Spark decides
    b'{"order_id": "\\ud800", "amount": 1}',                     # a lone surrogate
    b'{"order_id": "x", "amount": 1e400}',
    b'{"order_id": "x", "amount": 9007199254740993}',            # an int past 2**53 for a number
    b'{"order_id": {"n": 1}, "amount": 1}',
]


DECIDED = [  # decode errors decided without Spark (on_error: quarantine): not target rows
    b'{"amount": 1}',                                            # required order_id missing
    b'{"order_id": null, "amount": 1}',
    b'this is not json',
    b' \n hello',
    b'',
    None,
]


def connector_batch(payloads: list[bytes | None], partition: int | None, first: int) -> pa.RecordBatch:
    n = len(payloads)
    schema = arrow_schema(True)
    columns = {
        "topic": ["/default/split"] * n, "partition": [partition] * n, "offset": list(range(first, first + n)),
        "publish_time": [datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=timezone.utc)] * n,
        "producer_name": ["p"] * n, "producer_id": [None] * n, "payload": payloads,
        "attributes": [[("k", "v")]] * n, "schema_id": [None] * n, "schema_version": [None] * n, "source": ["wal"] * n,
    }
    return pa.RecordBatch.from_pydict(columns, schema=schema)


def by_offset(table: pa.Table) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda r: (r["_topic"], r["_offset"]))


def test_the_arrow_split_is_the_spark_split_and_leaves_the_rest_to_spark(spark):
    decoder = Decoder(DecodeConfig(format="json", inline_schema=json.dumps(SCHEMA)))
    gate = QualityGate(ExpectationsConfig(suite="tail-split", rules=RULES))
    clean = [json.dumps(r).encode() for r in CLEAN]
    batches = [connector_batch([*clean, *UNCLEAN, *DECIDED], None, 0),
               connector_batch([*DECIDED, *UNCLEAN, *clean], 3, 100)]
    expected = spark_split(spark, decoder, gate, batches)

    plain, rest = ArrowSplit(decoder, RULES).split(batches)
    assert plain is not None
    left = {o for b in rest for o in b.column("offset").to_pylist()}
    assert left == {*range(len(clean), len(clean) + len(UNCLEAN)),
                    *range(100 + len(DECIDED), 100 + len(DECIDED) + len(UNCLEAN))}
    from_spark = spark_split(spark, decoder, gate, rest)
    assert plain.schema.equals(expected.schema), (plain.schema, expected.schema)
    assert by_offset(plain) == by_offset(expected.filter(pa.compute.invert(
        pa.compute.is_in(expected["_offset"], pa.array(sorted(left), pa.int64())))))
    assert by_offset(pa.concat_tables([plain, from_spark.cast(plain.schema)])) == by_offset(expected)
    assert {r["order_id"] for r in plain.to_pylist()} == {"a", "b", "c", "h\u00e9\u4e2d"}
