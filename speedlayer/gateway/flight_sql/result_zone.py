"""A statement's zoned timestamps given in the caller's time zone: the same instants, labelled with
the zone its `timezone` header names (a JDBC URL's `timeZone=`; ADBC's call header).

Why: the Arrow Flight SQL JDBC driver reads a zoned timestamp as the wall-clock time in the
column's zone, shifted by the difference between the connection's zone (the URL's `timeZone`,
else the JVM's) and the column's, and then makes a `java.sql.Timestamp` of that wall-clock time in
the JVM's zone (17.0.0 and 18.3.0 alike). With the column in UTC, only a JVM in UTC got the
instant back: in Asia/Kolkata `getTimestamp` returned 2024-01-29 07:00Z as 20:00 the day before
(01:30 with `timeZone=UTC`). Labelled in the connection's zone, the column's wall-clock time is
the JVM's when that zone is the JVM's, and the instant comes back whole: so `timeZone=<the JVM's
zone>` in the URL makes both a bound timestamp (`parameters.in_zone`) and a zoned one read back
exact, in any JVM (only a wall-clock time in the hour a DST change repeats stays ambiguous to
`Timestamp`). The values are the same instants for every client; a client that sends no zone
gets the columns' own. Timestamps without a zone (and dates) carry no zone to label: the driver's
shift of those by the connection's zone is not something the gateway can undo without sending
other clients other values.
"""

from __future__ import annotations

from typing import Iterable, Iterator
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import pyarrow as pa

from speedlayer.errors import InvalidRequestError


def checked_zone(zone: str | None) -> str | None:
    """The caller's zone if it names one (IANA name, or UTC); InvalidRequestError otherwise."""
    if not zone:
        return None
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidRequestError(f"time zone {zone!r} (the 'timezone' header, a JDBC URL's timeZone=): "
                                  f"not a time zone name such as UTC or Europe/Vienna") from exc
    return zone


def in_caller_zone(schema: pa.Schema, zone: str | None) -> pa.Schema:
    """`schema` with each zoned timestamp column labelled with `zone` (unchanged without one)."""
    if not zone or not any(_zoned(field.type) for field in schema):
        return schema
    fields = [field.with_type(pa.timestamp(field.type.unit, zone)) if _zoned(field.type) else field
              for field in schema]
    return pa.schema(fields, metadata=schema.metadata)


def conformed(batches: Iterable[pa.RecordBatch], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """`batches` with `schema`'s column types where only their zone labels differ (no copy)."""
    for batch in batches:
        yield _conform(batch, schema)


def conformed_table(batches: list[pa.RecordBatch], schema: pa.Schema) -> pa.Table:
    """A complete answer as one table of `schema`."""
    return pa.Table.from_batches([_conform(batch, schema) for batch in batches], schema)


def _conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    if batch.schema.types == schema.types:
        return batch
    return pa.RecordBatch.from_arrays([column.cast(field.type) if column.type != field.type else column
                                       for column, field in zip(batch.columns, schema)], schema=schema)


def _zoned(data_type: pa.DataType) -> bool:
    return pa.types.is_timestamp(data_type) and bool(data_type.tz)
