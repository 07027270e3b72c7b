"""A dataset's tail rows as a table in the worker's DuckDB database, beside its epochs' tables.

Why a table and not the Arrow rows themselves: an answer reads the epoch's table `UNION ALL BY
NAME` the tail rows above the epoch's offsets. Registered as an Arrow table, those rows were
scanned through pyarrow's dataset scanner on every statement (filters pushed into Python, every
column converted again): at 100 k tail rows beside a 1 M-row epoch a point lookup took 1.95x and
a group-by 1.47x the epoch alone through the gateway (bench/bench_tail_queries.py). A DuckDB
table is stored, compressed and zone-mapped like the epoch's, and filtered by `_offset` as a
range: in one process 1.2x and 1.13x.

What keeps an answer exact with rows added and deleted under it: its relation names the offset
range per partition its snapshot counted (`relation`), so rows appended later are not read, and
the store (`TailStore`) deletes rows (`delete_below`, `drop`) only once every answer that took
its snapshot before the trim has ended. Starting each answer's DuckDB transaction at its snapshot
instead (a `BEGIN` and a read of the table under the store's lock) did the same for 0.6 ms of
every answer, a fifth of what the tail added to a point lookup.

A column a newer schema version adds reaches the tail before any epoch: it is added to the table
(`ALTER TABLE ... ADD COLUMN`, NULL in the rows before it), as Delta's schema merge adds it.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Callable, Mapping

import pyarrow as pa

from speedlayer.worker.loader import literal, quote

if TYPE_CHECKING:
    import duckdb

TOPIC, OFFSET = "_topic", "_offset"
TABLE_PREFIX = "speedlayer_tail__"
_INCOMING = "speedlayer_tail_incoming"
_sequence = itertools.count(1)


class TailTable:
    """The rows of one dataset's tail, in `name` (made at the first append). Writes (`append`,
    `delete_below`, `drop`) are serialised by the caller (the store's lock)."""

    def __init__(self, cursor: Callable[[], "duckdb.DuckDBPyConnection"], dataset: str) -> None:
        self._writer = cursor()
        # One table per tail started: a tail followed anew (its pipeline changed) never shares
        # a table with the one it replaces, which running answers may still read.
        self.name = f"{TABLE_PREFIX}{dataset}__{next(_sequence)}"
        self._columns: set[str] | None = None

    def append(self, rows: pa.Table) -> None:
        """Add `rows` (they carry `_topic` and `_offset`), adding the columns the table lacks."""
        if not rows.num_rows:
            return
        writer, table = self._writer, quote(self.name)
        writer.register(_INCOMING, rows)
        try:
            if self._columns is None:
                writer.execute(f"CREATE TABLE {table} AS SELECT * FROM {_INCOMING}")
                self._columns = set(rows.column_names)
                return
            for name in [n for n in rows.column_names if n not in self._columns]:
                kind = writer.from_arrow(rows.select([name])).types[0]
                writer.execute(f"ALTER TABLE {table} ADD COLUMN {quote(name)} {kind}")
                self._columns.add(name)
            writer.execute(f"INSERT INTO {table} BY NAME SELECT * FROM {_INCOMING}")
        finally:
            writer.unregister(_INCOMING)

    def delete_below(self, offsets: Mapping[str, int]) -> None:
        """Delete the rows below `offsets` (every epoch still served holds them)."""
        if self._columns is None or not offsets:
            return
        below = " OR ".join(f"({TOPIC} = {literal(topic)} AND {OFFSET} < {int(offset)})"
                            for topic, offset in sorted(offsets.items()))
        self._writer.execute(f"DELETE FROM {quote(self.name)} WHERE {below}")

    def drop(self) -> None:
        """Drop the table and close the writer (no answer reads the table any more)."""
        try:
            if self._columns is not None:
                self._writer.execute(f"DROP TABLE IF EXISTS {quote(self.name)}")
        finally:
            self._writer.close()

    def relation(self, ranges: Mapping[str, tuple[int, int]]) -> str:
        """A SELECT of the rows in `ranges` (per partition, `[first, end)`)."""
        within = " OR ".join(f"({TOPIC} = {literal(topic)} AND {OFFSET} >= {int(first)} AND {OFFSET} < {int(end)})"
                             for topic, (first, end) in sorted(ranges.items()))
        return f"SELECT * FROM {quote(self.name)} WHERE {within}"
