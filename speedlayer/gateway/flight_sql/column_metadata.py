"""Flight SQL's column metadata on the schemas the gateway sends (FlightSql.proto, `CommandGetTables`):
`ARROW:FLIGHT:SQL:TYPE_NAME` (the SQL type a tool shows; ADBC's `xdbc_type_name`),
`PRECISION` and `SCALE` of decimals (JDBC's `getPrecision`/`getScale`), `IS_READ_ONLY`,
`IS_AUTO_INCREMENT`, `IS_CASE_SENSITIVE`, `IS_SEARCHABLE`, and, for a dataset's table schema,
`CATALOG_NAME`, `SCHEMA_NAME` and `TABLE_NAME` (a result's column may be an expression of
several tables: those three are left out there). Nullability is the Arrow field's own flag.
"""

from __future__ import annotations

import pyarrow as pa

KEY = "ARROW:FLIGHT:SQL:"

_NAMES = (
    (pa.types.is_boolean, "BOOLEAN"), (pa.types.is_int8, "TINYINT"), (pa.types.is_int16, "SMALLINT"),
    (pa.types.is_int32, "INTEGER"), (pa.types.is_int64, "BIGINT"), (pa.types.is_uint8, "UTINYINT"),
    (pa.types.is_uint16, "USMALLINT"), (pa.types.is_uint32, "UINTEGER"), (pa.types.is_uint64, "UBIGINT"),
    (pa.types.is_float16, "FLOAT"), (pa.types.is_float32, "FLOAT"), (pa.types.is_float64, "DOUBLE"),
    (pa.types.is_decimal, "DECIMAL"), (pa.types.is_string, "VARCHAR"), (pa.types.is_large_string, "VARCHAR"),
    (pa.types.is_binary, "BLOB"), (pa.types.is_large_binary, "BLOB"), (pa.types.is_date, "DATE"),
    (pa.types.is_time, "TIME"), (pa.types.is_duration, "INTERVAL"), (pa.types.is_interval, "INTERVAL"),
    (pa.types.is_list, "LIST"), (pa.types.is_large_list, "LIST"), (pa.types.is_struct, "STRUCT"),
    (pa.types.is_map, "MAP"),
)


def type_name(data_type: pa.DataType) -> str:
    """The SQL name of an Arrow type as DuckDB, which computed the column, calls it."""
    if pa.types.is_timestamp(data_type):
        return "TIMESTAMP WITH TIME ZONE" if data_type.tz else "TIMESTAMP"
    for test, name in _NAMES:
        if test(data_type):
            return name
    return str(data_type).upper()


def column_metadata(field: pa.Field, table: tuple[str, str, str] | None = None) -> dict[str, str]:
    """The Flight SQL keys for one column; `table`: (catalog, schema, table) it belongs to."""
    values = {"TYPE_NAME": type_name(field.type), "IS_READ_ONLY": "1", "IS_AUTO_INCREMENT": "0",
              "IS_CASE_SENSITIVE": "1" if pa.types.is_string(field.type) or pa.types.is_large_string(field.type)
              else "0", "IS_SEARCHABLE": "1"}
    if pa.types.is_decimal(field.type):
        values.update(PRECISION=str(field.type.precision), SCALE=str(field.type.scale))
    if table is not None:
        values.update(CATALOG_NAME=table[0], SCHEMA_NAME=table[1], TABLE_NAME=table[2])
    return {KEY + k: v for k, v in values.items()}


def described(schema: pa.Schema, table: tuple[str, str, str] | None = None) -> pa.Schema:
    """`schema` with each column's Flight SQL metadata (kept beside any metadata it had)."""
    fields = [f.with_metadata({**(f.metadata or {}), **{k.encode(): v.encode()
                                                        for k, v in column_metadata(f, table).items()}})
              for f in schema]
    return pa.schema(fields, metadata=schema.metadata)
