"""A prepared statement's bound parameters, written into its SQL as typed literals.

The workers' protocol carries SQL text, not parameters, so the gateway binds them: each `?`
(or `$n`) is replaced, at the place DuckDB's parser located it, by a literal cast to the
parameter's Arrow type (`CAST('2024-01-02' AS DATE)`). Every value is rendered from its
Arrow type, never from text the client wrote, so a parameter cannot change the statement's
shape; the worker's SQL guard then checks the bound statement as it checks any other.
Parameters arrive as one record batch per `DoPut` (Flight SQL); a statement runs with one row
of them.
"""

from __future__ import annotations

import datetime
import decimal
import math
from typing import Any

import pyarrow as pa

from speedlayer.errors import InvalidRequestError
from speedlayer.gateway.flight_sql.statements import LIMIT_HINT, Statement


def _sql_type(arrow_type: pa.DataType) -> str | None:
    """The DuckDB type for a parameter of `arrow_type`; None if such parameters are not taken."""
    simple = {
        pa.bool_(): "BOOLEAN", pa.int8(): "TINYINT", pa.int16(): "SMALLINT", pa.int32(): "INTEGER",
        pa.int64(): "BIGINT", pa.uint8(): "UTINYINT", pa.uint16(): "USMALLINT", pa.uint32(): "UINTEGER",
        pa.uint64(): "UBIGINT", pa.float16(): "FLOAT", pa.float32(): "FLOAT", pa.float64(): "DOUBLE",
        pa.string(): "VARCHAR", pa.large_string(): "VARCHAR", pa.string_view(): "VARCHAR",
        pa.binary(): "BLOB", pa.large_binary(): "BLOB", pa.date32(): "DATE", pa.date64(): "DATE",
        pa.null(): "NULL",
    }
    if arrow_type in simple:
        return simple[arrow_type]
    if pa.types.is_timestamp(arrow_type):
        return "TIMESTAMPTZ" if arrow_type.tz else "TIMESTAMP"
    if pa.types.is_decimal(arrow_type):
        return f"DECIMAL({arrow_type.precision}, {arrow_type.scale})" if arrow_type.precision <= 38 else "DOUBLE"
    if pa.types.is_time(arrow_type):
        return "TIME"
    return None


def _literal(value: Any, sql_type: str) -> str:
    if value is None or sql_type == "NULL":
        return "NULL"
    if isinstance(value, bool):
        text = "TRUE" if value else "FALSE"
    elif isinstance(value, int):
        text = str(value)
    elif isinstance(value, float):
        text = repr(value) if math.isfinite(value) else f"'{value}'"
    elif isinstance(value, decimal.Decimal):
        text = f"'{value}'"
    elif isinstance(value, bytes):
        text = "'" + "".join(f"\\x{b:02X}" for b in value) + "'"
    elif isinstance(value, datetime.datetime):
        text = f"'{value.isoformat(sep=' ')}'"
    elif isinstance(value, (datetime.date, datetime.time)):
        text = f"'{value.isoformat()}'"
    elif isinstance(value, str):
        text = "'" + value.replace("'", "''") + "'"
    else:  # _sql_type admits only the types above
        raise InvalidRequestError(f"parameter value {value!r}: unsupported")
    return f"CAST({text} AS {sql_type})"


def parameter_literals(batch: pa.RecordBatch | pa.Table, expected: int) -> tuple[str, ...]:
    """The SQL literals of the one row of parameters in `batch`, which must have `expected` columns
    of supported types (InvalidRequestError naming the parameter otherwise)."""
    if batch.num_columns != expected:
        raise InvalidRequestError(f"the statement takes {expected} parameter(s); {batch.num_columns} were bound")
    if batch.num_rows != 1:
        raise InvalidRequestError(f"bind one row of parameters per execution; got {batch.num_rows} rows")
    literals = []
    for index, (field, column) in enumerate(zip(batch.schema, batch.columns), start=1):
        arrow_type = field.type
        if pa.types.is_dictionary(arrow_type):
            column, arrow_type = column.cast(arrow_type.value_type), arrow_type.value_type
        sql_type = _sql_type(arrow_type)
        if sql_type is None:
            raise InvalidRequestError(f"parameter {index} ({field.name!r}): type {arrow_type} is not supported; "
                                      f"bind a number, string, boolean, binary, date, time, timestamp or decimal")
        literals.append(_literal(column[0].as_py(), sql_type))
    return tuple(literals)


def parameter_schema(statement: Statement, columns: pa.Schema) -> pa.Schema:
    """Typed parameters for drivers that bind by type (JDBC): a parameter compared with a column
    has the column's type, a LIMIT count int64, any other a string (DuckDB casts it)."""
    fields = []
    for index, hint in enumerate(statement.parameter_hints, start=1):
        if hint == LIMIT_HINT:
            arrow_type = pa.int64()
        elif hint is not None and hint in columns.names:
            arrow_type = columns.field(hint).type
        else:
            arrow_type = pa.utf8()
        fields.append(pa.field(f"parameter_{index}", arrow_type))
    return pa.schema(fields)


_KINDS = (pa.types.is_null, lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
          lambda t: pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t),
          pa.types.is_boolean, pa.types.is_temporal, lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t))


def same_kind(value: pa.DataType, column: pa.DataType) -> bool:
    """A value of type `value` compares with a column of type `column` without a conversion that
    can fail (NULL compares with anything)."""
    return pa.types.is_null(value) or any(kind(value) and kind(column) for kind in _KINDS[1:])


def merged(schemas: list[pa.Schema]) -> pa.Schema:
    """The columns of several datasets, a name's first occurrence winning (for parameter types)."""
    fields: dict[str, pa.Field] = {}
    for schema in schemas:
        for field in schema:
            fields.setdefault(field.name, field)
    return pa.schema(list(fields.values()))
