"""A query on a sharded dataset as one query per shard and one merge at the gateway (pure).

DuckDB's own parse tree of the SQL (`protocol.sql_tree`) is rewritten, never the text:

* an aggregate query (GROUP BY, or count/sum/min/max/avg) runs on each shard as a GROUP BY on
  the same keys returning partial aggregates (avg as sum and count), and the gateway's merge
  groups the partials again (counts and sums summed, min of mins, max of maxes, sum/count for
  avg), then applies HAVING, ORDER BY and LIMIT to the whole;
* a projection runs on each shard with its ORDER BY and LIMIT (LIMIT + OFFSET rows: the shard's
  top N) and any ORDER BY key that is not an output column added as a hidden column; the merge
  orders all shards' rows again, applies LIMIT/OFFSET and drops the hidden columns.

Everything else cannot be combined from partial answers and is refused with
`InvalidQueryError` naming the construct: aggregates that do not decompose (count DISTINCT,
median, quantiles, string_agg, ...), window functions, subqueries, joins, CTEs, set operations,
SELECT DISTINCT, GROUPING SETS/ROLLUP/CUBE, GROUP BY ALL, QUALIFY, samples.

`pruning` maps partition columns to the values a conjunct of the WHERE clause admits
(`col = literal`, `col IN (literals)`); `shards_to_ask` keeps the shards holding one of them.
A predicate on any other column prunes nothing (the query is still right: every shard runs it).
`partition_pruning` reads the same of any query reading only the dataset (no subquery, CTE or
join): when it leaves one shard, that shard holds every row the query sees and answers it as is.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from speedlayer.errors import InvalidQueryError
from speedlayer.protocol.sql_tree import aggregate_names, parse_tree, parse_valid_tree, to_sql

PARTIALS = "__partials"  # the table of the shards' answers the merge reads
DECOMPOSABLE = ("count", "count_star", "sum", "min", "max", "avg", "mean")
Node = dict[str, Any]


@dataclass(frozen=True)
class ShardQuery:
    """What each shard runs (as the dataset), what the gateway runs over their answers (as
    `PARTIALS`), and the partition values the WHERE clause admits (column -> values)."""

    shard_sql: str
    merge_sql: str
    pruning: dict[str, frozenset[str]]


class Unshardable(InvalidQueryError):
    """A query shape the gateway cannot combine from shards' answers; `construct` names it."""

    def __init__(self, construct: str) -> None:
        super().__init__(construct)
        self.construct = construct


def plan_query(sql: str, dataset: str, partition_columns: list[str]) -> ShardQuery:
    """Raises `Unshardable` (a bad shape) or InvalidQueryError (SQL that does not parse)."""
    tree = parse_valid_tree(sql)
    statements = tree.get("statements", [])
    if len(statements) != 1:
        raise Unshardable(f"{len(statements)} statements")
    node = statements[0]["node"]
    _check_shape(node, dataset)
    aggregates = [n for part in _clauses(node) for n in _aggregates(part)]
    grouped = bool(node.get("group_expressions")) or bool(aggregates)
    shard, merge = (_aggregate(node, aggregates) if grouped else _projection(node))
    pruning = _pruning(node.get("where_clause"), partition_columns)
    return ShardQuery(_sql(tree, shard), _sql(tree, merge), pruning)


def partition_pruning(sql: str, partition_columns: list[str],
                      parameters: dict[str, str] | None = None) -> dict[str, frozenset[str]]:
    """`ShardQuery.pruning` of `sql` without planning it (any shape), a `$n` compared as the text
    of its bound value in `parameters` (by number; strings and integers only, as literals):
    InvalidQueryError if it does not parse."""
    tree = parse_valid_tree(sql)
    node = tree.get("statements", [{}])[0].get("node", {}) if len(tree.get("statements", [])) == 1 else {}
    # Only a query that reads nothing but the dataset's rows its WHERE clause admits may be pruned:
    # a subquery, a CTE or a join could read other rows of the dataset.
    if (node.get("type") != "SELECT_NODE" or node.get("cte_map", {}).get("map")
            or (node.get("from_table") or {}).get("type") != "BASE_TABLE"
            or any(n.get("class") == "SUBQUERY" for n in _walk(node))):
        return {}
    return _pruning(node.get("where_clause"), partition_columns, parameters or {})


def shards_to_ask(shard_values: list[dict[str, list[str]]], pruning: dict[str, frozenset[str]]) -> list[int]:
    """Indexes of the shards that may hold rows the WHERE clause admits (at least one: the
    answer's shape comes from a shard even when no row matches). A literal no shard holds as
    written prunes nothing on its column (it may be another spelling of a value, e.g. a
    timestamp), so pruning never drops a shard that holds matching rows."""
    keep = list(range(len(shard_values)))
    for column, wanted in pruning.items():
        held = [{v for c, vs in values.items() if c.lower() == column for v in vs} for values in shard_values]
        if not all(any(w in h for h in held) for w in wanted):
            continue
        keep = [i for i in keep if held[i] & wanted]
    return keep or [0]


def _sql(tree: Node, node: Node) -> str:
    return to_sql({**tree, "statements": [{**tree["statements"][0], "node": node}]})


def _check_shape(node: Node, dataset: str) -> None:
    if node.get("type") != "SELECT_NODE":
        raise Unshardable("UNION/INTERSECT/EXCEPT" if node.get("type") == "SET_OPERATION_NODE" else str(node.get("type")))
    if node.get("cte_map", {}).get("map"):
        raise Unshardable("WITH (a common table expression)")
    source = node.get("from_table") or {}
    if source.get("type") == "JOIN":
        raise Unshardable("a join")
    if source.get("type") != "BASE_TABLE" or str(source.get("table_name", "")).lower() != dataset.lower():
        raise Unshardable(f"reading {source.get('type', 'no table').lower().replace('_', ' ')} instead of the "
                          f"dataset {dataset}")
    for key, construct in (("sample", "USING SAMPLE"), ("qualify", "QUALIFY")):
        if node.get(key):
            raise Unshardable(construct)
    if source.get("sample"):
        raise Unshardable("TABLESAMPLE")
    if len(node.get("group_sets", [])) > 1:
        raise Unshardable("GROUPING SETS / ROLLUP / CUBE")
    if node.get("aggregate_handling") not in (None, "STANDARD_HANDLING"):
        raise Unshardable("GROUP BY ALL")
    for modifier in node.get("modifiers", []):
        kind = modifier.get("type")
        if kind == "DISTINCT_MODIFIER":
            raise Unshardable("SELECT DISTINCT")
        if kind == "LIMIT_PERCENT_MODIFIER":
            raise Unshardable("LIMIT ... PERCENT")
        if kind == "LIMIT_MODIFIER" and not all(_integer(modifier.get(k)) is not None or modifier.get(k) is None
                                                for k in ("limit", "offset")):
            raise Unshardable("LIMIT or OFFSET given by an expression")
    for part in _clauses(node) + [node.get("where_clause")]:
        for found in _walk(part):
            if found.get("class") == "WINDOW":
                raise Unshardable(f"window function {found.get('function_name')}() OVER (...)")
            if found.get("class") == "SUBQUERY":
                raise Unshardable("a subquery")


def _clauses(node: Node) -> list[Any]:
    """The parts whose expressions the merge evaluates: select list, HAVING, ORDER BY keys."""
    return [node.get("select_list", []), node.get("having"), _orders(node)]


def _orders(node: Node) -> list[Node]:
    return [o for m in node.get("modifiers", []) if m.get("type") == "ORDER_MODIFIER" for o in m["orders"]]


def _walk(tree: Any) -> list[Node]:
    found: list[Node] = []
    stack = [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            found.append(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def _aggregates(tree: Any) -> list[Node]:
    """The outermost aggregate calls in `tree` (checked: decomposable, no DISTINCT/ORDER BY)."""
    if isinstance(tree, list):
        return [a for item in tree for a in _aggregates(item)]
    if not isinstance(tree, dict):
        return []
    name = str(tree.get("function_name", "")).lower()
    if tree.get("class") == "FUNCTION" and name in aggregate_names() | {"count_star"}:
        if name not in DECOMPOSABLE:
            raise Unshardable(f"aggregate {name}()")
        if tree.get("distinct"):
            raise Unshardable(f"{name}(DISTINCT ...)")
        if tree.get("order_bys", {}).get("orders"):
            raise Unshardable(f"{name}(... ORDER BY ...)")
        return [tree]
    return [a for value in tree.values() for a in _aggregates(value)]


def _canonical(tree: Any) -> str:
    """An expression's identity, its place in the text and its alias left out."""
    def strip(item: Any) -> Any:
        if isinstance(item, dict):
            out = {k: strip(v) for k, v in item.items() if k not in ("query_location", "query_location_length", "alias")}
            if out.get("class") == "COLUMN_REF":
                out["column_names"] = [str(item["column_names"][-1]).lower()]
            return out
        return [strip(v) for v in item] if isinstance(item, list) else item
    return json.dumps(strip(tree), sort_keys=True)


def _integer(node: Any) -> int | None:
    literal = (node or {}).get("literal", {}) if isinstance(node, dict) else {}
    if node and node.get("class") == "CONSTANT" and literal.get("kind") in ("INTEGER", "BIGINT"):
        return int(literal["text"])
    return None


def _expression(sql: str) -> Node:
    """The parse tree of one expression (a merge's aggregate over partial columns)."""
    return parse_tree(f"SELECT {sql}")["statements"][0]["node"]["select_list"][0]


def _column(name: str, alias: str = "") -> Node:
    return {**_expression(f'"{name}"'), "alias": alias}


def _output_name(item: Node) -> str:
    """The column name DuckDB gives a select item: its alias, a column's name, else its text."""
    if item.get("alias"):
        return str(item["alias"])
    if item.get("class") == "COLUMN_REF":
        return str(item["column_names"][-1])
    bare = parse_tree("SELECT 1")
    text = _sql(bare, {**bare["statements"][0]["node"], "select_list": [{**item, "alias": ""}]})
    return text[len("SELECT "):]


def _renamed(call: Node, function: str, alias: str) -> Node:
    """A copy of an aggregate call as `function` (same arguments and FILTER), aliased."""
    return {**copy.deepcopy(call), "alias": alias, "function_name": function, "qualified_name": {"path": [function]}}


def _aggregate(node: Node, aggregates: list[Node]) -> tuple[Node, Node]:
    select = node.get("select_list", [])
    keys = []
    for key in node.get("group_expressions", []):
        position = _integer(key)
        keys.append({**copy.deepcopy(select[position - 1]), "alias": ""} if position else key)
    key_names = {_canonical(k): f"__g{i}" for i, k in enumerate(keys)}
    partials: list[Node] = [{**copy.deepcopy(k), "alias": f"__g{i}"} for i, k in enumerate(keys)]
    merged: dict[str, Node] = {}
    for aggregate in aggregates:
        identity = _canonical(aggregate)
        if identity in merged:
            continue
        name, first = str(aggregate["function_name"]).lower(), f"__a{len(partials)}"
        partials.append(_renamed(aggregate, "sum" if name in ("avg", "mean") else name, first))
        if name in ("avg", "mean"):
            second = f"__a{len(partials)}"
            partials.append(_renamed(aggregate, "count", second))
            merged[identity] = _expression(f'CAST(sum("{first}") AS DOUBLE) / NULLIF(sum("{second}"), 0)')
        elif name in ("count", "count_star"):
            merged[identity] = _expression(f'CAST(sum("{first}") AS BIGINT)')
        else:
            merged[identity] = _expression(f'{name}("{first}")')

    def rewrite(tree: Any) -> Any:
        if isinstance(tree, list):
            return [rewrite(item) for item in tree]
        if not isinstance(tree, dict):
            return tree
        identity = _canonical(tree)
        if identity in key_names:
            return _column(key_names[identity], tree.get("alias", ""))
        if identity in merged:
            return {**merged[identity], "alias": tree.get("alias", "")}
        return {k: rewrite(v) for k, v in tree.items()}

    group = list(range(len(keys)))
    shard = {**node, "select_list": partials, "group_expressions": keys, "group_sets": [group] if keys else [],
             "having": None, "modifiers": []}
    merge = {**node, "from_table": _partials_table(), "where_clause": None,
             "select_list": [{**rewrite(item), "alias": _output_name(item)} for item in select],
             "group_expressions": [_column(f"__g{i}") for i in group], "group_sets": [group] if keys else [],
             "having": rewrite(node.get("having")), "modifiers": rewrite(node.get("modifiers", []))}
    return shard, merge


def _projection(node: Node) -> tuple[Node, Node]:
    outputs = {str(item.get("alias") or "").lower() for item in node.get("select_list", [])} - {""}
    hidden: list[Node] = []
    merge_modifiers: list[Node] = []
    shard_modifiers: list[Node] = []
    for modifier in node.get("modifiers", []):
        if modifier.get("type") == "ORDER_MODIFIER":
            orders = []
            for order in modifier["orders"]:
                expr = order["expression"]
                named = expr.get("class") == "COLUMN_REF" and str(expr["column_names"][-1]).lower() in outputs
                if _integer(expr) is not None or named:
                    orders.append(order)
                    continue
                name = f"__o{len(hidden)}"
                hidden.append({**copy.deepcopy(expr), "alias": name})
                orders.append({**order, "expression": _column(name)})
            merge_modifiers.append({**modifier, "orders": orders})
            shard_modifiers.append(modifier)
        elif modifier.get("type") == "LIMIT_MODIFIER":
            merge_modifiers.append(modifier)
            top = (_integer(modifier.get("limit")) or 0) + (_integer(modifier.get("offset")) or 0)
            shard_modifiers.append({**modifier, "limit": _expression(str(top)) if modifier.get("limit") else None,
                                    "offset": None})
    shard = {**node, "select_list": node.get("select_list", []) + hidden, "modifiers": shard_modifiers}
    exclude = ", ".join(f'"{h["alias"]}"' for h in hidden)
    star = _expression(f"* EXCLUDE ({exclude})" if hidden else "*")
    merge = {**node, "select_list": [star], "from_table": _partials_table(), "where_clause": None,
             "modifiers": merge_modifiers}
    return shard, merge


def _partials_table() -> Node:
    return parse_tree(f"SELECT * FROM {PARTIALS}")["statements"][0]["node"]["from_table"]


def _pruning(where: Any, partition_columns: list[str], parameters: dict[str, str] | None = None,
             ) -> dict[str, frozenset[str]]:
    columns = {c.lower() for c in partition_columns}
    if not isinstance(where, dict) or not columns:
        return {}
    conjuncts = where["children"] if where.get("type") == "CONJUNCTION_AND" else [where]
    found: dict[str, frozenset[str]] = {}
    for conjunct in conjuncts:
        column, values = _admitted(conjunct, parameters or {})
        if column in columns and values is not None:
            found[column] = found[column] & values if column in found else values
    return found


def _admitted(conjunct: Node, parameters: dict[str, str]) -> tuple[str, frozenset[str] | None]:
    """(column, values) for `column = literal` or `column IN (literals)` (a `$n` of `parameters`
    counting as its value's literal), else ("", None)."""
    sides: list[Node]
    if conjunct.get("type") == "COMPARE_EQUAL":
        sides = [conjunct.get("left") or {}, conjunct.get("right") or {}]
    elif conjunct.get("type") == "COMPARE_IN":
        sides = list(conjunct.get("children", []))
    else:
        return "", None
    refs = [s for s in sides[:1 if conjunct.get("type") == "COMPARE_IN" else 2] if s.get("class") == "COLUMN_REF"]
    literals: list[Node] = []
    for side in sides:
        if side.get("class") == "CONSTANT":
            literals.append(side.get("literal") or {})
        elif side.get("class") == "PARAMETER" and str(side.get("identifier")) in parameters:
            literals.append({"kind": "STRING", "text": parameters[str(side.get("identifier"))]})
    if len(refs) != 1 or len(literals) != len(sides) - 1:
        return "", None
    if any(lit.get("kind") not in ("STRING", "INTEGER", "BIGINT") for lit in literals):
        return "", None
    return str(refs[0]["column_names"][-1]).lower(), frozenset(str(lit["text"]) for lit in literals)
