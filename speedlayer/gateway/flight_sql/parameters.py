"""A prepared statement's bound parameters: checked, typed for drivers, carried to the worker.

Parameters arrive as one record batch per `DoPut` (Flight SQL); a statement runs with one row
of them. The worker receives the statement with `$1`, `$2`, ... in the parameters' places
(`Statement.bound_sql`) and the values beside it, exactly as bound, for DuckDB to bind
(`protocol.query_parameters`): a value is never written into SQL text. Drivers that bind by
the announced types (JDBC) get a parameter schema from the columns each parameter meets.
"""

from __future__ import annotations

import pyarrow as pa

from speedlayer.errors import InvalidRequestError
from speedlayer.gateway.flight_sql.statements import LIMIT_HINT, Statement
from speedlayer.protocol.query_parameters import pack_parameters


def _bindable_value(arrow_type: pa.DataType) -> bool:
    """Whether DuckDB takes a parameter of `arrow_type` as the same value: numbers, strings,
    booleans, binary, dates, times, timestamps, decimals (and NULL)."""
    return any(check(arrow_type) for check in (
        pa.types.is_null, pa.types.is_boolean, pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal,
        pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view, pa.types.is_binary,
        pa.types.is_large_binary, pa.types.is_date, pa.types.is_time, pa.types.is_timestamp))


def parameter_values(batch: pa.RecordBatch | pa.Table, expected: int) -> str:
    """The one row of parameters in `batch`, which must have `expected` columns of supported
    types (InvalidRequestError naming the parameter otherwise), packed for the query ticket with
    its columns named by parameter number."""
    if batch.num_columns != expected:
        raise InvalidRequestError(f"the statement takes {expected} parameter(s); {batch.num_columns} were bound")
    if batch.num_rows != 1:
        raise InvalidRequestError(f"bind one row of parameters per execution; got {batch.num_rows} rows")
    columns = []
    for index, (field, column) in enumerate(zip(batch.schema, batch.columns), start=1):
        if pa.types.is_dictionary(field.type):
            column = column.cast(field.type.value_type)
        if not _bindable_value(column.type):
            raise InvalidRequestError(f"parameter {index} ({field.name!r}): type {column.type} is not supported; "
                                      f"bind a number, string, boolean, binary, date, time, timestamp or decimal")
        columns.append(column)
    return pack_parameters(pa.table(columns, names=[str(n) for n in range(1, expected + 1)]))


# The JDBC URL's `timeZone=<zone>`: Avatica writes a Timestamp as wall-clock time in that zone
# (the JVM's without it), and the Arrow Flight SQL driver sends the URL's unknown keys as headers.
TIME_ZONE_HEADER = "timezone"


def compared_columns(statement: Statement, columns: pa.Schema) -> list[pa.DataType | None]:
    """The type of the column each parameter is compared with; None for a LIMIT count or where
    nothing tells."""
    return [columns.field(hint).type if hint is not None and hint != LIMIT_HINT and hint in columns.names
            else None for hint in statement.parameter_hints]


def parameter_schema(statement: Statement, columns: pa.Schema) -> pa.Schema:
    """Typed parameters for drivers that bind by type (JDBC): a parameter compared with a column
    has the column's type as the driver can write it (`bindable`), a LIMIT count int64, any other
    a string (DuckDB casts it)."""
    fields = []
    for index, (hint, column) in enumerate(zip(statement.parameter_hints, compared_columns(statement, columns)),
                                           start=1):
        arrow_type = pa.int64() if hint == LIMIT_HINT else bindable(column) if column is not None else pa.utf8()
        fields.append(pa.field(f"parameter_{index}", arrow_type))
    return pa.schema(fields)


def bindable(column: pa.DataType) -> pa.DataType:
    """The parameter type to announce for a value compared with a column of type `column`.

    The Arrow Flight SQL JDBC driver (17.0.0 and 18.3.0 alike) writes a `setTimestamp` as epoch
    milliseconds, a `setTime` as milliseconds of the day and a `setDate` as days, whatever unit
    the announced type has (apache/arrow-java#838): a timestamp announced in microseconds got
    milliseconds, a date in 1970, and `ts >= ?` matched every row. So dates, times and timestamps
    are announced in the units the driver writes. Its milliseconds are wall-clock time in the
    connection's zone even for a zoned column (Avatica shifts them by the zone's offset), so a
    zoned column's parameter is announced without a zone, and `in_zone` makes the value an instant.
    Drivers that bind by their own types (ADBC) are unaffected."""
    if pa.types.is_timestamp(column):
        return pa.timestamp("ms")
    if pa.types.is_time(column):
        return pa.time32("ms")
    if pa.types.is_date(column):
        return pa.date32()
    return column


def in_zone(parameters: pa.Table, statement: Statement, columns: pa.Schema, zone: str | None) -> pa.Table:
    """`parameters` with each timestamp without a zone that is compared with a zoned column made
    the instant it names in `zone` (the caller's `TIME_ZONE_HEADER`). Without a zone such a value
    names no instant (a JDBC driver's wall-clock time in its JVM's zone, which the gateway cannot
    know): InvalidRequestError saying how to name it, never a comparison off by that zone's offset."""
    import pyarrow.compute as pc

    for index, column in enumerate(compared_columns(statement, columns)):
        if index >= parameters.num_columns or column is None or not pa.types.is_timestamp(column) or not column.tz:
            continue
        value = parameters.column(index)
        if not pa.types.is_timestamp(value.type) or value.type.tz:
            continue
        if not zone:
            raise InvalidRequestError(
                f"parameter {index + 1} is a timestamp without a time zone compared with a column with one "
                f"({column}): say which zone it is in, with timeZone=<zone> in the JDBC URL (the JVM's zone, "
                f"e.g. timeZone=UTC; the driver sends it as the {TIME_ZONE_HEADER!r} header) or by binding a "
                f"timestamp with a time zone")
        try:
            instants = pc.assume_timezone(value, timezone=zone)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise InvalidRequestError(f"parameter {index + 1} in time zone {zone!r}: {exc}") from exc
        parameters = parameters.set_column(index, parameters.schema.field(index).with_type(instants.type), instants)
    return parameters


_KINDS = (pa.types.is_null, lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
          lambda t: pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t),
          pa.types.is_boolean, pa.types.is_temporal, lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t))


def same_kind(value: pa.DataType, column: pa.DataType) -> bool:
    """A value of type `value` compares with a column of type `column` without a conversion that
    can fail (NULL compares with anything)."""
    return pa.types.is_null(value) or any(kind(value) and kind(column) for kind in _KINDS[1:])


def values_fit_columns(statement: Statement, columns: pa.Schema, bound: pa.Schema) -> bool:
    """Whether each bound value is compared with a column (or is a LIMIT count) of its kind:
    numbers with numbers, strings with strings, ... (a string for an integer column may not
    convert: the worker would say so)."""
    if any(hint is None for hint in statement.parameter_hints):
        return False
    expected = parameter_schema(statement, columns)
    return all(same_kind(value.type, column.type) for value, column in zip(bound, expected))


def merged(schemas: list[pa.Schema]) -> pa.Schema:
    """The columns of several datasets, a name's first occurrence winning (for parameter types)."""
    fields: dict[str, pa.Field] = {}
    for schema in schemas:
        for field in schema:
            fields.setdefault(field.name, field)
    return pa.schema(list(fields.values()))
