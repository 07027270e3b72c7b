"""A query on a sharded dataset that cannot be combined from partial answers, run whole (pure).

`shard_query` refuses a shape that does not decompose (count DISTINCT, median, window functions,
joins, ...). When the shards the query reads fit the tenant's gather limit, the gateway gathers
the rows the query needs from each and runs the query itself. This module says what to fetch and
what to run, on DuckDB's parse tree of the SQL (`protocol.sql_tree`), never on its text:

* each shard runs `fetch_sql`: the dataset's columns the rest of the query names (every column
  when it has a star, names the table itself as a value, renames columns by position, joins
  NATURAL or pivots) of the rows its WHERE clause admits. The WHERE clause is pushed down only when the query is one
  SELECT reading nothing but the dataset (no join, subquery or CTE: as `partition_pruning`), its
  table is not sampled, and the clause names no column alias of the select list that is not also
  a column (DuckDB lets a WHERE use one, which the shard could not bind); otherwise every row is
  fetched;
* the gateway runs `local_sql` over the fetched rows bound as the dataset: the query as written,
  without the WHERE clause when it was pushed down (applied once, where the rows are: a volatile
  predicate such as `random() < 0.5` is not applied twice).

A gathered query runs in the gateway's own DuckDB, so it must read no more than a worker would
let it: one SELECT whose tables are the dataset (unqualified) and its own CTEs, and no table
function (the workers' SQL guard; the gateway may not import the worker). `gather_refusal` is
the decision: the shards' estimated memory against the limit, and the error a user reads.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from speedlayer.errors import InvalidQueryError
from speedlayer.protocol.sql_tree import check_reads_only, nodes, parse_tree, parse_valid_tree, to_sql

ROW_MARKER = "__gathered_row"  # the one column fetched when the query names none (count(DISTINCT 1), ...)
COMBINED = "count, sum, min, max, avg (with or without GROUP BY), ORDER BY ... LIMIT and plain projections"
Node = dict[str, Any]


@dataclass(frozen=True)
class GatherPlan:
    """What each shard runs (`fetch_sql`, on its dataset), what the gateway runs over their rows
    bound as the dataset (`local_sql`), the columns fetched, and whether the WHERE was pushed down."""

    fetch_sql: str
    local_sql: str
    columns: tuple[str, ...]
    filtered: bool


def plan_gather(sql: str, dataset: str, schema_names: list[str]) -> GatherPlan:
    """The gather of `sql` on `dataset`, whose columns are `schema_names` (in the table's order);
    InvalidQueryError if it does not parse or reads anything but the dataset and its CTEs."""
    tree = parse_valid_tree(sql)
    statements = tree.get("statements", [])
    if len(statements) != 1:
        raise InvalidQueryError(f"query on dataset {dataset!r}: expected one SELECT statement, got {len(statements)}")
    node = statements[0]["node"]
    check_reads_only(list(nodes(node)), dataset)
    filtered = _pushable(node, dataset, schema_names)
    local = {**node, "where_clause": None} if filtered else node
    columns = _needed_columns(list(nodes(local)), schema_names)  # a pushed-down WHERE's columns stay on the shards
    source = node["from_table"] if filtered else _base_table(dataset)
    select = [_column_ref(c) for c in columns] or [{**_expression("NULL"), "alias": ROW_MARKER}]
    fetch = {**_bare_select(), "select_list": select, "from_table": {**copy.deepcopy(source), "sample": None},
             "where_clause": node.get("where_clause") if filtered else None}
    return GatherPlan(_sql(tree, fetch), _sql(tree, local), columns, filtered)


def gather_refusal(construct: str, dataset: str, epoch: str, shard_count: int, asked: int, needed_bytes: int,
                   limit_bytes: int) -> str | None:
    """Why the query cannot be gathered (the error's text), or None when the `asked` shards'
    estimated memory `needed_bytes` is within `limit_bytes` (0: gathering is off)."""
    if 0 < limit_bytes and needed_bytes <= limit_bytes:
        return None
    why = (f"running it whole at the gateway needs {needed_bytes} bytes ({asked} shard(s)' estimated memory), "
           f"the gather limit is {limit_bytes} bytes" if limit_bytes > 0 else
           "running it whole at the gateway is off for this tenant (gather_max_bytes 0)")
    return (f"{construct} cannot be answered on dataset {dataset!r}: its epoch {epoch} is split into {shard_count} "
            f"shards and the gateway combines only {COMBINED}; {why} (the tenant's gather_max_bytes; a filter on "
            "a partition column reads fewer shards)")


def _needed_columns(found: list[Node], schema_names: list[str]) -> tuple[str, ...]:
    """The dataset's columns the query may read, in the table's order (all of them when it is not
    clear which: a star, the table as a value, columns renamed by position, a NATURAL join)."""
    tables = {str(n.get(k, "")).lower() for n in found if n.get("type") == "BASE_TABLE"
              for k in ("table_name", "alias")} - {""}
    named: set[str] = set()
    for item in found:
        if (item.get("class") == "STAR" or item.get("column_name_alias") or item.get("ref_type") == "NATURAL"
                or item.get("type") == "PIVOT"):  # PIVOT and UNPIVOT name the columns they spread in their own ways
            return tuple(schema_names)
        if item.get("class") == "COLUMN_REF":
            parts = [str(p).lower() for p in item.get("column_names", [])]
            if len(parts) == 1 and parts[0] in tables:
                return tuple(schema_names)  # the table's row as a struct
            named.update(parts)
        named.update(str(c).lower() for c in item.get("using_columns", []))
    return tuple(c for c in schema_names if c.lower() in named)


def _pushable(node: Node, dataset: str, schema_names: list[str]) -> bool:
    """The WHERE clause can run on the shards: see the module's docstring."""
    source = node.get("from_table") or {}
    where = node.get("where_clause")
    if (where is None or node.get("type") != "SELECT_NODE" or node.get("cte_map", {}).get("map")
            or source.get("type") != "BASE_TABLE" or str(source.get("table_name", "")).lower() != dataset.lower()
            or source.get("sample") or source.get("column_name_alias")
            or any(n.get("class") == "SUBQUERY" for n in nodes(node))):
        return False
    # DuckDB binds a WHERE name to the table's column first, to a select alias only when no column has it
    aliases = ({str(item.get("alias", "")).lower() for item in node.get("select_list", [])} - {""}
               - {c.lower() for c in schema_names})
    return not any(n.get("class") == "COLUMN_REF" and len(n.get("column_names", [])) == 1
                   and str(n["column_names"][0]).lower() in aliases for n in nodes(where))


def _sql(tree: Node, node: Node) -> str:
    return to_sql({**tree, "statements": [{**tree["statements"][0], "node": node}]})


def _bare_select() -> Node:
    return parse_tree("SELECT 1 FROM t")["statements"][0]["node"]


def _base_table(dataset: str) -> Node:
    return {**_bare_select()["from_table"], "table_name": dataset, "qualified_name": {"path": [dataset]}}


def _expression(sql: str) -> Node:
    return parse_tree(f"SELECT {sql}")["statements"][0]["node"]["select_list"][0]


def _column_ref(name: str) -> Node:
    return {**_expression("x"), "column_names": [name]}
