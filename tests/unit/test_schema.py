"""The Arrow conversion from decoded frames into the data source's Spark schema."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType

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


def test_a_users_schema_naming_some_columns_reads_those_in_its_order() -> None:
    from pyspark.sql.types import StructType

    from connectors.schema import decoded_columns, projected_columns

    wanted = StructType([spark_schema(True)["source"], SPARK_SCHEMA["payload"], SPARK_SCHEMA["offset"],
                         SPARK_SCHEMA["partition"]])
    columns = projected_columns(wanted, include_source=True)
    assert columns == ("source", "payload", "offset", "partition")
    assert decoded_columns(columns) == ("payload", "offset")  # nothing else is decoded
    raw = pa.RecordBatch.from_pylist([{"offset": 4, "payload": b"x"}, {"offset": 5, "payload": b"y"}],
                                     schema=pa.schema([MESSAGE_ARROW_SCHEMA.field("offset"),
                                                       MESSAGE_ARROW_SCHEMA.field("payload")]))
    out = to_spark_batch(raw, "/ns/orders-part-3", "wal", columns)
    assert out.schema.names == list(columns)
    assert out.to_pylist() == [{"source": "wal", "payload": b"x", "offset": 4, "partition": 3},
                               {"source": "wal", "payload": b"y", "offset": 5, "partition": 3}]
    assert projected_columns(SPARK_SCHEMA, include_source=False) == tuple(SPARK_SCHEMA.names)


@pytest.mark.parametrize("fields, include_source, said", [
    ([("nope", StringType())], False, "column 'nope' is not one of the danube source's: topic string, partition int"),
    ([("offset", StringType())], False, "column 'offset' is bigint in the danube source, not string"),
    ([("offset", LongType()), ("offset", LongType())], False, "column 'offset' is named twice"),
    ([("source", StringType())], False, "column 'source' needs the option includeSource=true"),
    ([], False, "schema: no column; name one or more of the danube source's: topic string"),
])
def test_a_users_schema_the_source_cannot_give_is_refused_naming_the_column(fields, include_source, said) -> None:
    from pyspark.sql.types import StructField, StructType

    from connectors.schema import projected_columns
    from danube_core.errors import ConfigError

    schema = StructType([StructField(name, kind) for name, kind in fields])
    with pytest.raises(ConfigError) as refused:
        projected_columns(schema, include_source)
    assert said in str(refused.value)
