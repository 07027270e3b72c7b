"""What a Flight SQL statement reads, and the gateway's short-lived statement state.

`analyse` parses a statement with DuckDB's own parser (`json_serialize_sql`, as the workers'
SQL guard does) to learn the datasets it names, where its parameters are, and where BI tools
qualified a table with the catalog and schema the gateway reports (`speedlayer.<tenant>.t`):
those qualifiers are cut, since a worker binds each dataset under its bare name. The worker
still checks the statement it receives; the gateway only needs to know where to send it.

`PreparedStatements` (handles a client creates, binds and closes), `AnswersAhead` (a prepared
statement started when its values are bound, before the client asks for it) and
`PendingResults` (an answer awaiting its `DoGet`) are bounded and expire, so a client that
never closes or never reads costs the gateway a bounded amount of memory.
"""

from __future__ import annotations

import functools
import json
import secrets
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import pyarrow as pa

from speedlayer.errors import InvalidQueryError, InvalidRequestError, NotFoundError, ResultTooLargeError

CATALOG = "speedlayer"

_parser = None
_parser_lock = threading.Lock()


def _parse_tree(sql: str) -> dict[str, Any]:
    """DuckDB's parse tree of `sql`, from one in-memory database opened once (opening one costs
    milliseconds; a cursor of it, its own connection, costs microseconds)."""
    import duckdb

    global _parser
    with _parser_lock:
        if _parser is None:
            _parser = duckdb.connect(":memory:")
    with _parser.cursor() as cursor:
        row = cursor.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()
        return json.loads(row[0]) if row else {"error": True}


def _nodes(tree: Any) -> Iterator[dict[str, Any]]:
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            yield node
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class Statement:
    """A parsed statement: the datasets it reads and how to write it for a worker. `_edits` are
    (start, end, replacement) over the UTF-8 bytes of `sql`, in order: a qualifier cut's text,
    or a parameter's 0-based number (`$2` is 1) where its bound literal goes."""

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
        """The SQL for the worker, with `literals` in the parameters' places."""
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
    tree = _parse_tree(sql)
    if tree.get("error"):
        raise InvalidQueryError(f"statement: {tree.get('error_message', 'cannot be parsed')}")
    statements = tree.get("statements", [])
    if len(statements) != 1 or statements[0].get("node", {}).get("type") != "SELECT_NODE":
        raise InvalidQueryError(f"expected one SELECT statement, got {len(statements)} statement(s) "
                                f"(the speed layer is read-only)")
    nodes = list(_nodes(statements))
    ctes = {entry["key"].lower() for node in nodes if isinstance(node.get("cte_map"), dict)
            for entry in node["cte_map"].get("map", [])}
    datasets: list[str] = []
    edits: list[tuple[int, int, str | int]] = []
    parameters = []
    for node in nodes:
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
    hints = _parameter_hints(nodes)
    return Statement(sql, tuple(sorted(datasets)), len(parameters),
                     tuple(hints.get(str(i)) for i in identifiers), shape_of(statements),
                     _parameters_in_filters_only(statements), tuple(edits))


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


@dataclass
class PreparedStatement:
    tenant: str
    statement: Statement
    literals: tuple[str, ...] | None = None  # bound by DoPut; None until then
    # The bound values are of the kinds of the columns they are compared with (no conversion
    # that could fail on the worker), so the answer's errors can only be the worker's.
    values_fit_columns: bool = False
    last_used: float = field(default_factory=time.monotonic)


class PreparedStatements:
    """Open prepared statements by handle; a handle is its tenant's only, and is forgotten after
    `idle_s` without use or when more than `capacity` are open (oldest first)."""

    def __init__(self, idle_s: float = 1800.0, capacity: int = 10_000) -> None:
        self.idle_s = idle_s
        self.capacity = capacity
        self._open: OrderedDict[bytes, PreparedStatement] = OrderedDict()
        self._lock = threading.Lock()

    def create(self, tenant: str, statement: Statement) -> bytes:
        handle = secrets.token_bytes(16)
        with self._lock:
            self._expire()
            self._open[handle] = PreparedStatement(tenant, statement)
            while len(self._open) > self.capacity:
                self._open.popitem(last=False)
        return handle

    def get(self, tenant: str, handle: bytes) -> PreparedStatement:
        with self._lock:
            self._expire()
            prepared = self._open.get(handle)
            if prepared is None or prepared.tenant != tenant:
                raise NotFoundError(f"unknown prepared statement handle {handle.hex()[:32]!r} (closed, expired after "
                                    f"{self.idle_s:.0f} s idle, or never created): prepare the statement again")
            prepared.last_used = time.monotonic()
            self._open.move_to_end(handle)
            return prepared

    def close(self, tenant: str, handle: bytes) -> None:
        """Forget `handle`. Idempotent: closing an unknown or expired handle (a gateway restarted,
        a driver closing twice) is not an error, and another tenant's handle is left alone."""
        with self._lock:
            prepared = self._open.get(handle)
            if prepared is not None and prepared.tenant == tenant:
                del self._open[handle]

    def _expire(self) -> None:
        cutoff = time.monotonic() - self.idle_s
        while self._open:
            handle, oldest = next(iter(self._open.items()))
            if oldest.last_used > cutoff:
                return
            del self._open[handle]


@dataclass
class _Pending:
    tenant: str
    schema: pa.Schema
    batches: Iterable[pa.RecordBatch]
    expires: float


class PendingResults:
    """Answers computed at `GetFlightInfo` awaiting their `DoGet`: read once, by the same tenant,
    within `ttl_s`. More than `capacity` waiting is refused (clients that never read): each holds
    up to the gateway's retry buffer of answer."""

    def __init__(self, ttl_s: float = 60.0, capacity: int = 256) -> None:
        self.ttl_s = ttl_s
        self.capacity = capacity
        self._waiting: dict[bytes, _Pending] = {}
        self._lock = threading.Lock()

    def put(self, tenant: str, schema: pa.Schema, batches: Iterable[pa.RecordBatch], ttl_s: float | None = None) -> bytes:
        handle = secrets.token_bytes(16)
        now = time.monotonic()
        with self._lock:
            for key in [k for k, p in self._waiting.items() if p.expires <= now]:
                del self._waiting[key]
            if len(self._waiting) >= self.capacity:
                raise ResultTooLargeError(f"{len(self._waiting)} statement results are waiting to be read (DoGet) "
                                          f"at this gateway; read or abandon them first")
            self._waiting[handle] = _Pending(tenant, schema, batches, now + (ttl_s or self.ttl_s))
        return handle

    def take(self, tenant: str, handle: bytes) -> tuple[pa.Schema, Iterable[pa.RecordBatch]]:
        with self._lock:
            pending = self._waiting.get(handle)
            if pending is None or pending.tenant != tenant or pending.expires <= time.monotonic():
                raise NotFoundError(f"unknown statement handle {handle.hex()[:32]!r}: a result is read once, within "
                                    f"{self.ttl_s:.0f} s of GetFlightInfo; execute the statement again")
            del self._waiting[handle]
        return pending.schema, pending.batches


@dataclass
class StartedAnswer:
    """A statement started ahead: for which tenant and bound values, on which epoch (None: not
    pinned by the caller, a join), its answer to come (`future`: schema and batches)."""

    tenant: str
    literals: tuple[str, ...]
    epoch: str | None
    future: Future
    expires: float


class AnswersAhead:
    """Prepared statements started before their `GetFlightInfo`: when a client binds values
    (`DoPut`), or prepares a statement that takes none, the gateway starts it at once on a small
    pool, so the worker's query overlaps the client's next round trips. `take` hands it to the
    `GetFlightInfo` of the same statement handle, tenant and values (one answer per handle).
    At most `capacity` are held (more are not started) for at most `ttl_s`; one not taken is
    dropped: cancelled if not begun, else its stream closed."""

    def __init__(self, capacity: int = 32, ttl_s: float = 30.0, threads: int = 4) -> None:
        self.capacity = capacity
        self.ttl_s = ttl_s
        self._started: dict[bytes, StartedAnswer] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="flight-sql-ahead")

    def start(self, handle: bytes, tenant: str, literals: tuple[str, ...], epoch: str | None,
              run: Callable[[], tuple[pa.Schema, Iterable[pa.RecordBatch]]]) -> bool:
        """Start `run` (the statement with `literals`, on `epoch`) for `handle`, replacing an answer
        started for it before; False (nothing started) while `capacity` are held."""
        now = time.monotonic()
        with self._lock:
            dropped = [self._started.pop(k) for k, a in list(self._started.items()) if a.expires <= now]
            previous = self._started.pop(handle, None)
            if previous is not None:
                dropped.append(previous)
            started = len(self._started) < self.capacity
            if started:
                self._started[handle] = StartedAnswer(tenant, literals, epoch, self._pool.submit(run),
                                                      now + self.ttl_s)
        for answer in dropped:
            drop(answer.future)
        return started

    def take(self, handle: bytes, tenant: str, literals: tuple[str, ...]) -> StartedAnswer | None:
        """The answer started for `handle` with these `literals` by `tenant`, no longer held here;
        None if there is none (never started, other values, expired: dropped)."""
        with self._lock:
            answer = self._started.pop(handle, None)
        if answer is None:
            return None
        if answer.tenant != tenant or answer.literals != literals or answer.expires <= time.monotonic():
            drop(answer.future)
            return None
        return answer

    def discard(self, handle: bytes) -> None:
        with self._lock:
            answer = self._started.pop(handle, None)
        if answer is not None:
            drop(answer.future)

    def __len__(self) -> int:
        return len(self._started)

    def close(self) -> None:
        with self._lock:
            held, self._started = list(self._started.values()), {}
        for answer in held:
            drop(answer.future)
        self._pool.shutdown(wait=False, cancel_futures=True)


def drop(future: Future) -> None:
    """Give up an answer: cancel it if it has not begun, else close its stream once it is there."""
    def close(done: Future) -> None:
        if not done.cancelled() and done.exception() is None:
            batches = done.result()[1]
            if hasattr(batches, "close"):
                batches.close()

    if not future.cancel():
        future.add_done_callback(close)
