"""The `danube` data source's Spark schema and the Arrow conversion into it (the hot path).

Executors decode frames into `MESSAGE_ARROW_SCHEMA` (raw, u64 columns as in the payload) and
`to_spark_batch` turns each decoded batch into exactly the Arrow schema Spark expects for
`SPARK_SCHEMA` (Spark checks it with `Schema.equals`), with vectorised pyarrow casts only:

* `topic` / `partition` come from the task's topic, not from `msg_id.topic_name`, which holds
  whatever the producing client sent; the `-part-N` suffix becomes the `partition` column.
* u64 columns that can exceed 2^63 (`producer_id`, `schema_id`) become `decimal(20,0)`, which
  holds every u64 exactly; `offset` is a `long` (WAL offsets stay far below 2^63).
* `publish_time` (u64 milliseconds, set by the client) becomes a UTC timestamp; a value too
  large for Spark's microsecond timestamps becomes null rather than failing the query.
* `schema_version` (u32) becomes a `long`, as Spark has no unsigned types.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.types import (
    BinaryType,
    DecimalType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from danube_core.errors import ConfigError
from danube_core.topics import TopicName

if TYPE_CHECKING:
    import numpy as np

# numpy and pyarrow.compute are imported by the conversion functions, not here: the stream's
# driver-side process (a fresh Python process per query) imports this module for the schema
# alone, and the two cost it ~0.1 s of CPU.

SOURCE_COLUMN = "source"
U64_DECIMAL = DecimalType(20, 0)

SPARK_SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("publish_time", TimestampType()),
        StructField("producer_name", StringType()),
        StructField("producer_id", U64_DECIMAL),
        StructField("payload", BinaryType()),
        StructField("attributes", MapType(StringType(), StringType())),
        StructField("schema_id", U64_DECIMAL),
        StructField("schema_version", LongType()),
    ]
)

_DECIMAL_U64 = pa.decimal128(20, 0)
_TIMESTAMP_US = pa.timestamp("us", tz="UTC")
# Largest publish_time (ms) whose microsecond value still fits Spark's int64 timestamps.
_MAX_PUBLISH_TIME_MS = (2**63 - 1) // 1000


def spark_schema(include_source: bool) -> StructType:
    """`SPARK_SCHEMA`, plus the lineage column `source` (object id or "wal") when asked for."""
    if not include_source:
        return SPARK_SCHEMA
    return StructType(SPARK_SCHEMA.fields + [StructField(SOURCE_COLUMN, StringType())])


@lru_cache(maxsize=2)
def arrow_schema(include_source: bool) -> pa.Schema:
    """The Arrow schema Spark requires from `read()` for `spark_schema(include_source)`."""
    from connectors.spark_compat import arrow_schema_of

    return arrow_schema_of(spark_schema(include_source))


# The decoder's column each Spark column is built from (topic, partition and source come from
# the read task, not from the message).
DECODED_FROM = {"offset": "offset", "publish_time": "publish_time", "producer_name": "producer_name",
                "producer_id": "producer_id", "payload": "payload", "attributes": "attributes",
                "schema_id": "schema_id", "schema_version": "schema_version"}


def projected_columns(requested: StructType, include_source: bool) -> tuple[str, ...]:
    """The columns a read returns for the schema Spark hands the source: the source's own
    (`spark_schema`), or a user's `.schema(...)` naming some of them, in its order. Only
    those are decoded and sent to the JVM: Spark passes a Python source no projection, so a
    query that needs 4 of the 10 columns says so with the schema. ConfigError naming the
    column for a name the source has not, another type, a repeat, or `source` without
    `includeSource`."""
    full = spark_schema(include_source)
    if [(f.name, f.dataType) for f in requested.fields] == [(f.name, f.dataType) for f in full.fields]:
        return tuple(full.names)
    known = {f.name: f.dataType for f in spark_schema(True).fields}
    offered = ", ".join(f"{name} {kind.simpleString()}" for name, kind in known.items())
    if not requested.fields:
        raise ConfigError(f"schema: no column; name one or more of the danube source's: {offered}")
    seen: set[str] = set()
    for field in requested.fields:
        kind = known.get(field.name)
        if kind is None:
            raise ConfigError(f"schema: column {field.name!r} is not one of the danube source's: {offered}")
        if field.name == SOURCE_COLUMN and not include_source:
            raise ConfigError(f"schema: column {SOURCE_COLUMN!r} needs the option includeSource=true")
        if field.dataType != kind:
            raise ConfigError(f"schema: column {field.name!r} is {kind.simpleString()} in the danube source, "
                              f"not {field.dataType.simpleString()}")
        if field.name in seen:
            raise ConfigError(f"schema: column {field.name!r} is named twice")
        seen.add(field.name)
    return tuple(requested.names)


def decoded_columns(columns: tuple[str, ...]) -> tuple[str, ...]:
    """The decoder columns `columns` are built from."""
    return tuple(DECODED_FROM[name] for name in columns if name in DECODED_FROM)


@lru_cache(maxsize=16)
def _projected_arrow_schema(columns: tuple[str, ...]) -> pa.Schema:
    full = arrow_schema(SOURCE_COLUMN in columns)
    return pa.schema([full.field(name) for name in columns])


def to_spark_batch(raw: pa.RecordBatch, topic: str, source: str | None,
                   columns: tuple[str, ...] | None = None) -> pa.RecordBatch:
    """Convert one decoded batch of `topic` (broker name) into the Spark schema.

    `source` is the lineage value for the `source` column, or None when it is not requested.
    `columns`: the Spark columns to build, in order (`projected_columns`; None: all of them);
    `raw` holds at least their `decoded_columns`.
    Columns are built from numpy buffers, never from Python scalars: pyarrow imports pandas
    to convert a Python value, which would cost each fresh Python worker ~0.4 s of CPU.
    """
    if columns is None:
        columns = tuple(spark_schema(source is not None).names)
    target = _projected_arrow_schema(columns)
    name = TopicName.parse(topic)
    rows = raw.num_rows
    partition = name.partition
    builders = {
        "topic": lambda: _repeated_string(name.base_name, rows),
        "partition": lambda: pa.nulls(rows, pa.int32()) if partition is None else _repeated_int32(partition, rows),
        "offset": lambda: raw.column("offset").cast(pa.int64()),
        "publish_time": lambda: _publish_time(raw.column("publish_time")),
        "producer_name": lambda: raw.column("producer_name"),
        "producer_id": lambda: _u64_to_decimal(raw.column("producer_id")),
        "payload": lambda: raw.column("payload"),
        "attributes": lambda: _cast(raw.column("attributes"), target.field("attributes").type),
        "schema_id": lambda: _u64_to_decimal(raw.column("schema_id")),
        "schema_version": lambda: raw.column("schema_version").cast(pa.int64()),
        SOURCE_COLUMN: lambda: _repeated_string(source or "", rows),
    }
    return pa.RecordBatch.from_arrays([builders[column]() for column in columns], schema=target)


def _u64_values(column: pa.Array) -> "np.ndarray":
    """A u64 column's value buffer as numpy (no copy; slots under nulls hold anything)."""
    import numpy as np

    data = column.buffers()[1]
    return np.frombuffer(data, dtype="<u8", count=len(column) + column.offset)[column.offset:]


def _repeated_string(value: str, rows: int) -> pa.Array:
    import numpy as np

    data = value.encode()
    offsets = np.arange(rows + 1, dtype=np.int32) * np.int32(len(data))
    return pa.Array.from_buffers(pa.string(), rows, [None, pa.py_buffer(offsets), pa.py_buffer(data * rows)], 0)


def _repeated_int32(value: int, rows: int) -> pa.Array:
    import numpy as np

    return pa.Array.from_buffers(pa.int32(), rows, [None, pa.py_buffer(np.full(rows, value, dtype=np.int32))], 0)


def _publish_time(millis: pa.Array) -> pa.Array:
    """u64 milliseconds -> timestamp[us, UTC] in one multiply; beyond Spark's range -> null."""
    import numpy as np
    import pyarrow.compute as pc

    values = _u64_values(millis)
    micros = values.astype(np.int64) * np.int64(1000)  # wraps only where too_large masks it
    too_large = values > _MAX_PUBLISH_TIME_MS
    if millis.null_count:  # the decoder never gives null publish times; other callers may
        valid = np.frombuffer(pc.is_valid(millis).buffers()[1], np.uint8)
        too_large |= ~np.unpackbits(valid, count=len(millis), bitorder="little").view(bool)
    nulls = int(np.count_nonzero(too_large))
    validity = pa.py_buffer(np.packbits(~too_large, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(_TIMESTAMP_US, len(millis), [validity, pa.py_buffer(micros)], nulls)


def _u64_to_decimal(column: pa.Array) -> pa.Array:
    """u64 -> decimal128(20,0) by laying out the 16-byte little-endian words directly.

    A u64 is the low word of a non-negative decimal128 whose high word is 0; this is exact and
    several times faster than Arrow's generic integer-to-decimal cast.
    """
    import numpy as np
    import pyarrow.compute as pc

    nulls = column.null_count
    words = np.zeros((len(column), 2), dtype=np.uint64)
    words[:, 0] = _u64_values(column)
    validity = pc.is_valid(column).buffers()[1] if nulls else None
    return pa.Array.from_buffers(_DECIMAL_U64, len(column), [validity, pa.py_buffer(words)], null_count=nulls)


def _cast(column: pa.Array, target: pa.DataType) -> pa.Array:
    # The decoder's map type may differ from Spark's only in field names/nullability flags.
    return column if column.type == target else column.cast(target)
