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

from speedlayer.errors import InvalidQueryError
from speedlayer.protocol.sql_tree import check_reads_only
from speedlayer.protocol.sql_tree import nodes as _nodes
from speedlayer.protocol.sql_tree import parse_tree as _parse_tree

ACCEPTED_CACHE_SIZE = 4096


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
    check_reads_only(list(_nodes(tree["statements"])), dataset, joined)
