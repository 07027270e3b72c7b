"""Whether the installed DuckDB writes the parse tree the speed layer's SQL handling reads.

The workers' SQL guard and the gateway's planners (the shard and gather rewrites, Flight SQL
statement analysis, bound parameters) read and rewrite the JSON of DuckDB's
`json_serialize_sql`: DuckDB's internal parse-tree format, not a stable interface. A key renamed
in a DuckDB release would not fail loudly; a guard would let through what it should refuse, a
rewrite would compute something else. So setup.cfg holds DuckDB to the line the suite runs
(`SUPPORTED_DUCKDB`), and a worker or gateway starts only after this probe: one known query
serialized, and every path those modules read in it checked, with an error naming the DuckDB
version found and the range supported when one is missing.
"""

from __future__ import annotations

from typing import Any

from danube_core.errors import ConfigError

SUPPORTED_DUCKDB = "duckdb>=2.0,<2.1"  # setup.cfg's speedlayer extra says the same (a test holds them equal)

PROBE_SQL = ("WITH recent AS (SELECT 1 AS k) SELECT k, sum(v) AS total FROM orders "
             "WHERE k = 1 AND v IN (1, 2) GROUP BY k HAVING sum(v) > 0 ORDER BY k LIMIT 3")

# Paths in the probe's tree (keys joined by dots, list indexes as digits) that the guard and the
# rewriters read, each with the value it must have, or None where being there is enough.
EXPECTED_PATHS: dict[str, str | None] = {
    "statements.0.node.type": "SELECT_NODE",
    "statements.0.node.cte_map.map.0.key": "recent",
    "statements.0.node.select_list.0.class": "COLUMN_REF",
    "statements.0.node.select_list.0.column_names": None,
    "statements.0.node.select_list.0.query_location": None,
    "statements.0.node.select_list.1.function_name": "sum",
    "statements.0.node.select_list.1.alias": "total",
    "statements.0.node.from_table.type": "BASE_TABLE",
    "statements.0.node.from_table.table_name": "orders",
    "statements.0.node.from_table.schema_name": None,
    "statements.0.node.from_table.catalog_name": None,
    "statements.0.node.where_clause.type": "CONJUNCTION_AND",
    "statements.0.node.where_clause.children.0.left": None,
    "statements.0.node.where_clause.children.0.right.literal.text": "1",
    "statements.0.node.group_expressions.0": None,
    "statements.0.node.group_sets": None,
    "statements.0.node.having": None,
    "statements.0.node.modifiers.0.orders": None,
    "statements.0.node.modifiers.1.limit": None,
}

_MISSING = object()


def _at(tree: Any, path: str) -> Any:
    """The value at `path` in `tree`, or `_MISSING`."""
    node = tree
    for step in path.split("."):
        if isinstance(node, dict) and step in node:
            node = node[step]
        elif isinstance(node, list) and step.isdigit() and int(step) < len(node):
            node = node[int(step)]
        else:
            return _MISSING
    return node


def format_problems(tree: dict[str, Any]) -> list[str]:
    """What in `tree` (the probe's parse tree) differs from what the speed layer reads: one
    line per missing path or unexpected value; empty when the format is the one supported."""
    problems = []
    for path, expected in EXPECTED_PATHS.items():
        found = _at(tree, path)
        if found is _MISSING:
            problems.append(f"no {path}")
        elif expected is not None and found != expected:
            problems.append(f"{path} is {found!r}, not {expected!r}")
    return problems


def check_format(tree: dict[str, Any], duckdb_version: str) -> None:
    """ConfigError naming `duckdb_version`, the range supported and what differs, unless the
    probe's `tree` has every path the speed layer reads."""
    problems = format_problems(tree)
    if problems:
        raise ConfigError(
            f"DuckDB {duckdb_version} writes a parse tree (json_serialize_sql) the speed layer cannot read: "
            f"{'; '.join(problems[:5])}{' ...' if len(problems) > 5 else ''}. The speed layer supports "
            f"{SUPPORTED_DUCKDB}: pip install '{SUPPORTED_DUCKDB}'")


def check_installed_duckdb() -> None:
    """Serialize the probe with the installed DuckDB and `check_format` it (a worker's and a
    gateway's first step)."""
    import duckdb

    from speedlayer.protocol.sql_tree import parse_tree

    check_format(parse_tree(PROBE_SQL), duckdb.__version__)
