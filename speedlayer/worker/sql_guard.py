"""What a query may read: its dataset and its own CTEs, nothing else on the worker.

A worker's DuckDB can read any file the worker process can (`read_parquet('/...')`, a quoted path
as a table, `read_text`), holds every epoch table of its tenant under its own name, and has
settings a caller could change. The gateway's tenant check is only a boundary if the SQL it
forwards can reach nothing but the dataset it names, bound to one pinned epoch. So before a query
runs, its parse tree (DuckDB's own parser, through `json_serialize_sql`) is walked: one SELECT,
table references only to the dataset or to CTEs the query defines, no table functions.

Parsing costs about a millisecond of the worker's CPU, most of a point lookup's, and dashboards
and freshness polls send the same text again and again: accepted (query, dataset) pairs are
remembered (a bounded LRU). A verdict depends on nothing but the text and the dataset's name, so
a remembered one is never stale; refusals are not remembered (each raises anew).
"""

from __future__ import annotations

import functools
import json
import threading
from typing import Any, Iterator

from speedlayer.errors import InvalidQueryError

_parser = None  # the parsing database, see _parser_database
_parser_lock = threading.Lock()
ACCEPTED_CACHE_SIZE = 4096


def _parser_database():
    """One in-memory DuckDB for parsing, opened once: opening one costs ~17 ms of CPU, and the
    Flight server runs calls on threads that come and go, so a per-thread one was opened for
    most queries. Each parse takes a cursor of it (its own connection, ~0.05 ms)."""
    import duckdb

    with _parser_lock:
        global _parser
        if _parser is None:
            _parser = duckdb.connect(":memory:")
        return _parser


def _parse_tree(sql: str) -> dict[str, Any]:
    with _parser_database().cursor() as cursor:
        return json.loads(cursor.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0])


def _nodes(tree: Any) -> Iterator[dict[str, Any]]:
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            yield node
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def _cte_names(nodes: list[dict[str, Any]]) -> set[str]:
    names: set[str] = set()
    for node in nodes:
        cte_map = node.get("cte_map")
        if isinstance(cte_map, dict):
            names.update(entry["key"].lower() for entry in cte_map.get("map", []))
    return names


def check_query(sql: str, dataset: str, joined: tuple[str, ...] = ()) -> None:
    """Raise InvalidQueryError naming the dataset unless `sql` is one SELECT that reads only
    `dataset` (unqualified), the `joined` datasets bound beside it, and CTEs it defines."""
    _accepted(sql, dataset, joined)


@functools.lru_cache(maxsize=ACCEPTED_CACHE_SIZE)
def _accepted(sql: str, dataset: str, joined: tuple[str, ...] = ()) -> bool:
    """True once `sql` passed the checks (lru_cache keeps no raised exception, so only
    acceptances are remembered)."""
    _check(sql, dataset, joined)
    return True


def _check(sql: str, dataset: str, joined: tuple[str, ...] = ()) -> None:
    import duckdb

    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise InvalidQueryError(f"query on dataset {dataset!r}: {exc}") from exc
    if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
        kinds = [s.type.name for s in statements]
        raise InvalidQueryError(f"query on dataset {dataset!r}: expected one SELECT statement, got {kinds}")
    tree = _parse_tree(sql)
    if tree.get("error"):
        raise InvalidQueryError(f"query on dataset {dataset!r}: {tree.get('error_message', 'cannot be parsed')}")
    nodes = list(_nodes(tree["statements"]))
    readable = {dataset.lower()} | {name.lower() for name in joined} | _cte_names(nodes)
    for node in nodes:
        kind = node.get("type")
        if kind == "TABLE_FUNCTION":
            name = node.get("function", {}).get("function_name", "?")
            raise InvalidQueryError(f"query on dataset {dataset!r}: table function {name}() is not allowed; "
                                    f"a query reads only its dataset {dataset!r}")
        if kind == "BASE_TABLE":
            qualified = ".".join(p for p in (node.get("catalog_name"), node.get("schema_name"),
                                             node.get("table_name")) if p)
            if node.get("catalog_name") or node.get("schema_name") or node["table_name"].lower() not in readable:
                raise InvalidQueryError(f"query on dataset {dataset!r}: it reads {qualified!r}; "
                                        f"a query reads only its dataset {dataset!r} and its own CTEs")
