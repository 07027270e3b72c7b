"""DuckDB's parse tree of a SQL text, shared by the workers' SQL guard and the gateway's Flight
SQL statement analysis (the gateway may not import the worker, so both read it from here).

`parse_tree` asks DuckDB's own parser (`json_serialize_sql`) of one in-memory database opened
once: opening one costs ~17 ms of CPU, and Flight servers run calls on threads that come and
go; each parse takes a cursor of it (its own connection, ~0.05 ms); `parse_valid_tree` raises
the user's InvalidQueryError instead of returning a tree of an error. `nodes` walks the tree;
`to_sql` prints a (rewritten) tree back as SQL (`json_deserialize_sql`), `aggregate_names`
says which function names DuckDB knows as aggregates, and `check_reads_only` is the rule both
the worker's guard and the gateway's gather hold a query to: it reads its dataset and its own
CTEs, nothing else.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Iterator

from speedlayer.errors import InvalidQueryError

_parser = None  # the parsing database, see _parser_database
_parser_lock = threading.Lock()


def _parser_database() -> Any:
    import duckdb

    global _parser
    with _parser_lock:
        if _parser is None:
            _parser = duckdb.connect(":memory:")
        return _parser


def parse_tree(sql: str) -> dict[str, Any]:
    """DuckDB's parse tree of `sql` as JSON; `{"error": True, "error_message": ...}` if it does
    not parse."""
    with _parser_database().cursor() as cursor:
        row = cursor.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()
        return json.loads(row[0]) if row else {"error": True}


def parse_valid_tree(sql: str) -> dict[str, Any]:
    """`parse_tree(sql)`, or InvalidQueryError ("SQL does not parse: ...", DuckDB's reason) when
    it does not parse: the error the gateway's planners give a user for unparsable SQL. How many
    statements the tree holds is the caller's to judge (each planner names that error its own way)."""
    tree = parse_tree(sql)
    if tree.get("error"):
        raise InvalidQueryError(f"SQL does not parse: {tree.get('error_message', 'syntax error')}")
    return tree


def to_sql(tree: dict[str, Any]) -> str:
    """The SQL text of a parse tree as `parse_tree` returns it (one statement)."""
    with _parser_database().cursor() as cursor:
        row = cursor.execute("SELECT json_deserialize_sql(?)", [json.dumps(tree)]).fetchone()
        return str(row[0])


_aggregates: frozenset[str] | None = None


def aggregate_names() -> frozenset[str]:
    """Lower-case names of DuckDB's aggregate functions (read once)."""
    global _aggregates
    if _aggregates is None:
        with _parser_database().cursor() as cursor:
            rows = cursor.execute("SELECT DISTINCT lower(function_name) FROM duckdb_functions() "
                                  "WHERE function_type = 'aggregate'").fetchall()
        _aggregates = frozenset(r[0] for r in rows)
    return _aggregates


def nodes(tree: Any) -> Iterator[dict[str, Any]]:
    """Every object (dict) of `tree`, at any depth."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            yield node
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def cte_names(tree_nodes: list[dict[str, Any]]) -> set[str]:
    """The names (lower case) of the CTEs defined among `tree_nodes`."""
    names: set[str] = set()
    for node in tree_nodes:
        cte_map = node.get("cte_map")
        if isinstance(cte_map, dict):
            names.update(entry["key"].lower() for entry in cte_map.get("map", []))
    return names


def check_reads_only(tree_nodes: list[dict[str, Any]], dataset: str, joined: tuple[str, ...] = ()) -> None:
    """Raise InvalidQueryError naming the dataset unless `tree_nodes` read only `dataset`
    (unqualified), the `joined` datasets bound beside it and CTEs they define, and call no table
    function (`read_parquet('/...')` would reach any file the process can)."""
    readable = {dataset.lower()} | {name.lower() for name in joined} | cte_names(tree_nodes)
    for node in tree_nodes:
        kind = node.get("type")
        if kind == "TABLE_FUNCTION":
            name = node.get("function", {}).get("function_name", "?")
            raise InvalidQueryError(f"query on dataset {dataset!r}: table function {name}() is not allowed; "
                                    f"a query reads only its dataset {dataset!r}")
        if kind == "BASE_TABLE" and (node.get("catalog_name") or node.get("schema_name")
                                     or str(node.get("table_name", "")).lower() not in readable):
            qualified = ".".join(p for p in (node.get("catalog_name"), node.get("schema_name"),
                                             node.get("table_name")) if p)
            raise InvalidQueryError(f"query on dataset {dataset!r}: it reads {qualified!r}; "
                                    f"a query reads only its dataset {dataset!r} and its own CTEs")
