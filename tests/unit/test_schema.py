"""The Arrow conversion from decoded frames into the data source's Spark schema."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest

from connectors.schema import SPARK_SCHEMA, arrow_schema, spark_schema, to_spark_batch
from danube_core.arrow_decode import MESSAGE_ARROW_SCHEMA

U64_MAX = 2**64 - 1


def raw_batch(rows: list[dict]) -> pa.RecordBatch:
    defaults = {
        "offset": 0, "request_id": 1, "producer_id": 7, "topic_name": "/x/y", "broker_addr": "",
        "topic_offset": 0, "payload": b"", "publish_time": 0, "producer_name": "p",
        "subscription_name": "", "attributes": [], "schema_id": None, "schema_version": None, "frame_pos": 0,
    }
    full = [{**defaults, **row} for row in rows]
    return pa.RecordBatch.from_pylist(full, schema=MESSAGE_ARROW_SCHEMA)


def test_schema_columns() -> None:
    assert SPARK_SCHEMA.fieldNames() == [
        "topic", "partition", "offset", "publish_time", "producer_name", "producer_id",
        "payload", "attributes", "schema_id", "schema_version",
    ]
    assert spark_schema(True).fieldNames()[-1] == "source"
    assert spark_schema(False) == SPARK_SCHEMA


def test_values_are_exact_and_typed() -> None:
    batch = raw_batch([
        {"offset": 10, "producer_id": U64_MAX, "payload": bytes(range(256)), "publish_time": 1700000000123,
         "producer_name": "prod", "attributes": [("b", "2"), ("a", "1")], "schema_id": U64_MAX,
         "schema_version": 2**32 - 1},
        {"offset": 11, "producer_id": 2**63, "schema_id": 0, "schema_version": 0},
    ])
    out = to_spark_batch(batch, "/default/orders", None)
    assert out.schema.equals(arrow_schema(False))
    first, second = out.to_pylist()
    assert first["topic"] == "/default/orders" and first["partition"] is None
    assert first["offset"] == 10
    assert first["producer_id"] == Decimal(U64_MAX) and second["producer_id"] == Decimal(2**63)
    assert first["payload"] == bytes(range(256))
    assert first["publish_time"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=dt.timezone.utc)
    assert dict(first["attributes"]) == {"a": "1", "b": "2"}
    assert first["schema_id"] == Decimal(U64_MAX) and second["schema_id"] == Decimal(0)
    assert first["schema_version"] == 2**32 - 1


def test_partition_comes_from_the_task_topic_and_source_is_lineage() -> None:
    batch = raw_batch([{"offset": 3, "topic_name": "/whatever/the-client-sent"}])
    out = to_spark_batch(batch, "/ns/orders-part-12", "data-0-1700000030.dnb1")
    assert out.schema.equals(arrow_schema(True))
    row = out.to_pylist()[0]
    assert (row["topic"], row["partition"], row["source"]) == ("/ns/orders", 12, "data-0-1700000030.dnb1")


def test_nulls_stay_null_in_sliced_batches() -> None:
    batch = raw_batch([{"schema_id": 5, "schema_version": 1}, {}, {"schema_id": U64_MAX}, {}]).slice(1, 3)
    rows = to_spark_batch(batch, "/a/b", None).to_pylist()
    assert [r["schema_id"] for r in rows] == [None, Decimal(U64_MAX), None]
    assert [r["schema_version"] for r in rows] == [None, None, None]


def test_publish_time_beyond_spark_range_becomes_null() -> None:
    rows = to_spark_batch(raw_batch([{"publish_time": U64_MAX}, {"publish_time": 0}]), "/a/b", None).to_pylist()
    assert rows[0]["publish_time"] is None
    assert rows[1]["publish_time"] == dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


@pytest.mark.parametrize("include_source", [False, True])
def test_empty_batch(include_source: bool) -> None:
    out = to_spark_batch(raw_batch([]), "/a/b-part-0", "wal" if include_source else None)
    assert out.num_rows == 0 and out.schema.equals(arrow_schema(include_source))
