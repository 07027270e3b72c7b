"""What a Flight SQL statement reads and how it is written for a worker.

`analyse` parses a statement with DuckDB's own parser (`json_serialize_sql`, as the workers'
SQL guard does) to learn the datasets it names, where its parameters are, and where BI tools
qualified a table with the catalog and schema the gateway reports (`speedlayer.<tenant>.t`):
those qualifiers are cut, since a worker binds each dataset under its bare name. So are the
`;`s and comments after the statement (`... WHERE id = ?; -- lookup`); a second statement after
a `;` is refused, named. The worker still checks the statement it receives; the gateway only
needs to know where to send it.

The statement state the gateway holds (prepared statements, pending results, answers started
ahead) is in `held`.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any


from speedlayer.errors import InvalidQueryError, InvalidRequestError
from speedlayer.protocol.sql_tree import cte_names, nodes, parse_tree

CATALOG = "speedlayer"

def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class Statement:
    """A parsed statement: the datasets it reads and how to write it for a worker. `_edits` are
    (start, end, replacement) over the UTF-8 bytes of `sql`, in order: a qualifier cut's text,
    or a parameter's 0-based number (`$2` is 1) where its placeholder goes."""

    sql: str
    datasets: tuple[str, ...]
    parameter_count: int
    # Per parameter: the column it is compared with (its type is the parameter's), LIMIT_HINT
    # for a LIMIT/OFFSET count, None where nothing tells.
    parameter_hints: tuple[str | None, ...]
    # The statement with the literals of its filters (WHERE, HAVING, QUALIFY, LIMIT) left out:
    # statements of one shape have one result schema on the same epochs (see `shape_of`).
    shape: str = field(repr=False, compare=False)
    # No parameter outside a filter: every binding of the statement answers with one schema
    # (that of its shape), so it is known before the answer (`SELECT ? AS x` is not so).
    fixed_schema: bool = field(repr=False, compare=False)
    _edits: tuple[tuple[int, int, str | int], ...] = field(repr=False)

    def render(self, literals: tuple[str, ...] = ()) -> str:
        """The SQL for the worker, with `literals` (SQL text: placeholders, or NULL in a schema
        probe; never a client's value) in the parameters' places."""
        if len(literals) != self.parameter_count:
            raise InvalidRequestError(f"the statement takes {self.parameter_count} parameter(s); "
                                      f"{len(literals)} were bound")
        raw = self.sql.encode()
        pieces, at = [], 0
        for start, end, replacement in self._edits:
            pieces.append(raw[at:start])
            pieces.append((literals[replacement] if isinstance(replacement, int) else replacement).encode())
            at = end
        pieces.append(raw[at:])
        return b"".join(pieces).decode()

    @property
    def bound_sql(self) -> str:
        """The SQL for the worker with `$1`, `$2`, ... in the parameters' places, for DuckDB to bind
        the values to (`protocol.query_parameters`)."""
        return self.render(tuple(f"${number}" for number in range(1, self.parameter_count + 1)))

    def targets(self) -> tuple[str, tuple[str, ...]]:
        """The dataset the statement is routed by and the others it joins (all must be held by one
        worker); InvalidQueryError if it names none."""
        if not self.datasets:
            raise InvalidQueryError("the statement names no dataset: a statement reads the tenant's datasets "
                                    "(see GetTables)")
        return self.datasets[0], self.datasets[1:]


@functools.lru_cache(maxsize=1024)
def analyse(sql: str, tenant: str) -> Statement:
    """The datasets `sql` reads and where its parameters are; InvalidQueryError if it is not one
    SELECT or names a table outside the tenant's schema. (Cached: dashboards repeat statements.)"""
    tree = parse_tree(sql)
    if tree.get("error"):
        _refuse_more_than_one(sql)
        raise InvalidQueryError(f"statement: {tree.get('error_message', 'cannot be parsed')}")
    statements = tree.get("statements", [])
    if len(statements) != 1 or statements[0].get("node", {}).get("type") != "SELECT_NODE":
        _refuse_more_than_one(sql)
        raise InvalidQueryError(f"expected one SELECT statement, got {len(statements)} statement(s) "
                                f"(the speed layer is read-only)")
    tree_nodes = list(nodes(statements))
    ctes = cte_names(tree_nodes)
    datasets: list[str] = []
    edits: list[tuple[int, int, str | int]] = []
    parameters = []
    for node in tree_nodes:
        if node.get("type") == "TABLE_FUNCTION":
            name = node.get("function", {}).get("function_name", "?")
            raise InvalidQueryError(f"table function {name}() is not allowed: a statement reads the tenant's datasets")
        if node.get("class") == "PARAMETER":
            parameters.append(node)
        elif node.get("type") == "BASE_TABLE":
            edit = _unqualify(node, tenant)
            if edit is not None:
                edits.append(edit)
            name = node["table_name"]
            if name.lower() not in ctes and name not in datasets:
                datasets.append(name)
    identifiers = sorted({int(p["identifier"]) for p in parameters}) if parameters else []
    if identifiers and identifiers != list(range(1, len(identifiers) + 1)):
        raise InvalidQueryError(f"statement parameters must be numbered from $1 without gaps; got {identifiers}")
    for node in sorted(parameters, key=lambda p: p["query_location"]):
        start = node["query_location"]  # DuckDB's locations are byte offsets into the UTF-8 text
        edits.append((start, start + node.get("query_location_length", 1), int(node["identifier"]) - 1))
    if len(parameters) != len(identifiers):  # $1 used twice: not supported by positional binding
        raise InvalidQueryError("each statement parameter may appear once (use ? placeholders)")
    edits.sort(key=lambda edit: edit[0])
    hints = _parameter_hints(tree_nodes)
    # The statement without the `;`s and comments after it: what a worker runs, and what the
    # schema probe wraps in a subquery (where a `;` or a `--` comment would end it early).
    body = sql.encode()[:statement_end(sql)].decode()
    return Statement(body, tuple(sorted(datasets)), len(parameters),
                     tuple(hints.get(str(i)) for i in identifiers), shape_of(statements),
                     _parameters_in_filters_only(statements), tuple(edits))


def statement_end(sql: str) -> int:
    """The byte offset where the one statement of `sql` ends: before the `;`s, comments and
    blanks trailing it (SQL editors and drivers add them: `... WHERE id = ?; -- lookup`). Found
    with DuckDB's tokenizer, so a `;` or `--` inside a string literal or a quoted name is text;
    the parse tree's locations (and so a statement's edits) all lie before it."""
    import duckdb

    raw = sql.encode()
    end = len(raw)
    for start, kind in reversed(duckdb.tokenize(sql)):  # (byte offset, kind) of each token
        trailing = kind == duckdb.token_type.comment or (
            kind == duckdb.token_type.operator and raw[start:start + 1] == b";")
        if not trailing:
            break
        end = start
    return len(raw[:end].rstrip())


def _refuse_more_than_one(sql: str) -> None:
    """InvalidQueryError naming the second statement if `sql` holds more than one (a `;` between
    two statements is not a trailing one: the text after it would be run, or silently dropped)."""
    import duckdb

    try:
        texts = [s.query.strip() for s in duckdb.extract_statements(sql)]
    except duckdb.Error:  # not even split into statements: the parser's error says why
        return
    if len(texts) > 1:
        second = texts[1] if len(texts[1]) <= 200 else texts[1][:200] + "..."
        raise InvalidQueryError(f"expected one SELECT statement, got {len(texts)}: after the first ';' comes "
                                f"another statement, {second!r} (a statement may end with ';' and comments "
                                f"only; the speed layer runs one SELECT per call)")


_FILTERS = ("where_clause", "having", "qualify", "limit", "offset")


def shape_of(tree: Any, in_filter: bool = False) -> str:
    """`tree` as canonical JSON without source positions and without the text of literals that
    sit in a filter or a LIMIT/OFFSET. Filters never change which columns, of which types, a
    statement returns, so `... WHERE id = 1` and `... WHERE id = 2` share a shape (and a probed
    result schema); literals anywhere else (the select list: `SELECT 5` is an INTEGER,
    `SELECT 5000000000` a BIGINT) stay in it."""
    def strip(node: Any, filtered: bool) -> Any:
        if isinstance(node, dict):
            if filtered and node.get("class") == "CONSTANT":
                return {"class": "CONSTANT", "kind": (node.get("literal") or {}).get("kind"),
                        "value_type": (node.get("value") or {}).get("type")}
            return {k: strip(v, filtered or k in _FILTERS) for k, v in node.items()
                    if not k.startswith("query_location")}
        if isinstance(node, list):
            return [strip(item, filtered) for item in node]
        return node

    return json.dumps(strip(tree, in_filter), sort_keys=True, separators=(",", ":"))


def _parameters_in_filters_only(tree: Any) -> bool:
    """Whether every parameter of `tree` sits in a filter or a LIMIT/OFFSET (see `shape_of`)."""
    stack = [(tree, False)]
    while stack:
        node, filtered = stack.pop()
        if isinstance(node, dict):
            if node.get("class") == "PARAMETER" and not filtered:
                return False
            stack.extend((value, filtered or key in _FILTERS) for key, value in node.items())
        elif isinstance(node, list):
            stack.extend((item, filtered) for item in node)
    return True


LIMIT_HINT = "#limit"


def _parameter_hints(nodes: list[dict[str, Any]]) -> dict[str, str]:
    """{parameter identifier: column it is compared with, or LIMIT_HINT}: `col = ?`, `? < col`,
    `col IN (?, ?)`, `col BETWEEN ? AND ?`, `LIMIT ?`. Client drivers (JDBC) need a typed
    parameter schema to bind values; these are the places a parameter's type is plain."""
    def column(node: Any) -> str | None:
        if isinstance(node, dict) and node.get("class") == "COLUMN_REF":
            return node["column_names"][-1]
        return None

    def parameter(node: Any) -> str | None:
        if isinstance(node, dict) and node.get("class") == "PARAMETER":
            return node["identifier"]
        return None

    hints: dict[str, str] = {}
    for node in nodes:
        groups: list[list[Any]] = []
        if node.get("class") == "COMPARISON":
            groups = [[node.get("left"), node.get("right")]]
        elif node.get("class") == "BETWEEN":
            groups = [[node.get("input"), node.get("lower")], [node.get("input"), node.get("upper")]]
        elif node.get("type") in ("COMPARE_IN", "COMPARE_NOT_IN"):
            children = node.get("children") or []
            groups = [[children[0], child] for child in children[1:]]
        elif node.get("type") == "LIMIT_MODIFIER":
            for key in ("limit", "offset"):
                identifier = parameter(node.get(key))
                if identifier:
                    hints[identifier] = LIMIT_HINT
        for group in groups:
            name = next((column(n) for n in group if column(n)), None)
            for item in group:
                identifier = parameter(item)
                if name and identifier:
                    hints[identifier] = name
    return hints


def _unqualify(node: dict[str, Any], tenant: str) -> tuple[int, int, str] | None:
    catalog, schema = node.get("catalog_name") or "", node.get("schema_name") or ""
    if not catalog and not schema:
        return None
    if schema.lower() != tenant.lower() or catalog.lower() not in ("", CATALOG):
        qualified = ".".join(p for p in (catalog, schema, node["table_name"]) if p)
        raise InvalidQueryError(f"the statement reads {qualified!r}: tables are the datasets of tenant {tenant!r}, "
                                f"named bare or as {CATALOG}.{tenant}.<dataset>")
    if node.get("column_name_alias"):
        raise InvalidQueryError("column aliases on a qualified dataset name are not supported: name it bare")
    text = _quote(node["table_name"])
    if node.get("alias"):
        text += " AS " + _quote(node["alias"])
    start = node["query_location"]
    return start, start + node["query_location_length"], text
