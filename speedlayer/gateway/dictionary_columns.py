"""Results with dictionary-encoded columns (DuckDB's ENUMs): a worker's Flight stream of them
cannot be read ("IPC stream did not have the expected number (1) of dictionaries"), whichever
replica answers, so the gateway asks for such columns as their values instead, and refuses the
query by the columns' names when even that answer holds dictionaries.

Pure: the statement text in, the statement that casts out. A statement always becomes a
subquery here (`SELECT * REPLACE (...) FROM (<sql>\n) AS q`); its text ends at its last token
(the gateway's `flight_sql.statements` cut what followed), and the closing parenthesis goes on a
line of its own, after a comment the text may end with.
"""

from __future__ import annotations

import pyarrow as pa


def dictionary_columns(schema: pa.Schema) -> list[pa.Field]:
    """The top-level columns of `schema` that are dictionary-encoded."""
    return [f for f in schema if pa.types.is_dictionary(f.type)]


def cast_to_values(sql: str, columns: list[pa.Field]) -> str:
    """`sql` with each of `columns` cast to its dictionary's value type (an ENUM to VARCHAR)."""
    casts = ", ".join(f"CAST({_quoted(f.name)} AS {_sql_type(f.type.value_type)}) AS {_quoted(f.name)}"
                      for f in columns)
    return f"SELECT * REPLACE ({casts}) FROM ({sql}\n) AS speedlayer_values"


def refusal(columns: list[pa.Field]) -> str:
    names = ", ".join(repr(f.name) for f in columns)
    first = _quoted(columns[0].name)
    return (f"the result's column(s) {names} are dictionary-encoded (an ENUM) and cannot be sent: "
            f"select them cast to their values, e.g. CAST({first} AS VARCHAR)")


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _sql_type(value_type: pa.DataType) -> str:
    if pa.types.is_string(value_type) or pa.types.is_large_string(value_type):
        return "VARCHAR"
    if pa.types.is_integer(value_type):
        return "BIGINT"
    return "VARCHAR"
