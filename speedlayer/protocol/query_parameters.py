"""A statement's parameter values on their way to DuckDB: on the wire, then bound, never SQL text.

A Flight SQL prepared statement's `?`s reach the workers as `$1`, `$2`, ... in the SQL and
their values beside it in the query ticket (`QueryRequest.parameters`): one row of Arrow IPC,
base64 in the ticket's JSON, a column per parameter named by its number, so each value keeps
its Arrow type exactly. Whoever runs the SQL (a worker, or the gateway merging or gathering a
sharded dataset's answers) binds them with DuckDB's own parameter binding (`bound`), so no value
is ever parsed as SQL, whatever quotes or semicolons it holds. A rewritten statement (a shard's
partial query, the merge over its answers) may keep only some of the `$n`s: each text is bound
with the values it names.
"""

from __future__ import annotations

import base64
import functools
from typing import Any

import pyarrow as pa

from speedlayer.errors import InvalidRequestError
from speedlayer.protocol.sql_tree import nodes, parse_tree


def pack_parameters(values: pa.Table) -> str:
    """`values` (one row, a column per parameter named by its number) as the ticket carries them."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, values.schema) as writer:
        writer.write_table(values)
    return base64.b64encode(sink.getvalue().to_pybytes()).decode()


@functools.lru_cache(maxsize=1024)
def unpack_parameters(packed: str) -> dict[str, Any]:
    """The values of `pack_parameters`' text by parameter number ("1", "2", ...), as DuckDB binds
    them (cached: a dashboard sends the same values again; the dict is never changed)."""
    try:
        table = pa.ipc.open_stream(base64.b64decode(packed, validate=True)).read_all()
    except (ValueError, pa.ArrowException) as exc:
        raise InvalidRequestError(f"query ticket: 'parameters' is not base64 Arrow IPC: {exc}") from exc
    if table.num_rows != 1:
        raise InvalidRequestError(f"query ticket: 'parameters' must hold one row, not {table.num_rows}")
    return {name: _value(column) for name, column in zip(table.column_names, table.columns)}


def _value(column: pa.ChunkedArray) -> Any:
    """A Python value DuckDB binds as the Arrow value's type: Python's int, float, str, bytes,
    bool, Decimal, date, time and (naive or zoned) datetime map to DuckDB's types of the same
    values. Nanoseconds, which a datetime cannot hold, are refused unless they are whole micros."""
    if pa.types.is_timestamp(column.type) and column.type.unit == "ns":
        try:
            column = column.cast(pa.timestamp("us", column.type.tz))  # safe: fails if nanoseconds would be lost
        except pa.ArrowInvalid as exc:
            raise InvalidRequestError(f"a timestamp parameter with nanoseconds is not supported: {exc}") from exc
    if pa.types.is_time(column.type) and column.type.unit == "ns":
        column = column.cast(pa.time64("us"))
    return column[0].as_py()


@functools.lru_cache(maxsize=4096)
def parameter_numbers(sql: str) -> frozenset[str]:
    """The numbers of the `$n` parameters `sql` names (cached: the same texts come again)."""
    tree = parse_tree(sql)
    if tree.get("error"):
        return frozenset()  # running it reports the parse error
    return frozenset(str(node["identifier"]) for node in nodes(tree.get("statements", []))
                     if node.get("class") == "PARAMETER")


def bound(sql: str, packed: str) -> dict[str, Any] | None:
    """The parameters to run `sql` with: the values of `packed` that `sql` names, by number
    (None for a statement without parameters, which DuckDB runs as it is)."""
    if not packed:
        return None
    values = unpack_parameters(packed)
    wanted = parameter_numbers(sql)
    missing = sorted(wanted - values.keys(), key=int)
    if missing:
        raise InvalidRequestError(f"the statement names parameter(s) {', '.join('$' + n for n in missing)} and "
                                  f"no value was bound for them")
    return {number: values[number] for number in wanted}
