"""The tables behind the epochs a worker holds, shared between a base epoch and its increments.

A full epoch is one DuckDB table (its *part*). An incremental epoch adds one part, the files
added since its base, and is queried through a view over the base's parts and its own
(`UNION ALL`), so a chain of increments holds every row once. Parts are reference-counted by
the epochs that use them: dropping an epoch drops its view and only the parts no other held
epoch still reads. The view is created after every part is fully loaded, so an epoch's relation
only ever shows the whole epoch.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

from speedlayer.worker.loader import quote

EpochKey = tuple[str, str]  # (dataset, epoch)


@dataclass(frozen=True)
class EpochTables:
    """What queries of an epoch read (`relation`, a table or a view) and the parts behind it."""

    relation: str
    parts: tuple[str, ...]


class HeldTables:
    """`cursor()` returns a DuckDB cursor on the worker's database."""

    def __init__(self, cursor: Callable) -> None:
        self._cursor = cursor
        self._lock = threading.Lock()
        self._epochs: dict[EpochKey, EpochTables] = {}
        self._refs: dict[str, int] = {}

    def get(self, key: EpochKey) -> EpochTables | None:
        with self._lock:
            return self._epochs.get(key)

    def acquire_base(self, key: EpochKey) -> tuple[str, ...] | None:
        """Pin the parts of a held epoch for an increment being loaded on top of it (so that the
        base being dropped meanwhile keeps them); None if the epoch is not held."""
        with self._lock:
            tables = self._epochs.get(key)
            if tables is None:
                return None
            for part in tables.parts:
                self._refs[part] += 1
            return tables.parts

    def release_parts(self, parts: tuple[str, ...]) -> None:
        """Undo `acquire_base` (the increment failed or was unassigned while loading)."""
        with self._lock:
            dead = self._unref(parts)
        self._drop(dead)

    def add_full(self, key: EpochKey, table: str) -> EpochTables:
        tables = EpochTables(relation=table, parts=(table,))
        with self._lock:
            self._refs[table] = self._refs.get(table, 0) + 1
            self._epochs[key] = tables
        return tables

    def add_increment(self, key: EpochKey, relation: str, base_parts: tuple[str, ...], part: str) -> EpochTables:
        """The increment's view over `base_parts` (already pinned by `acquire_base`) and `part`."""
        parts = (*base_parts, part)
        selects = " UNION ALL ".join(f"SELECT * FROM {quote(p)}" for p in parts)
        self._cursor().execute(f"CREATE OR REPLACE VIEW {quote(relation)} AS {selects}")
        tables = EpochTables(relation=relation, parts=parts)
        with self._lock:
            self._refs[part] = self._refs.get(part, 0) + 1
            self._epochs[key] = tables
        return tables

    def drop(self, key: EpochKey) -> None:
        with self._lock:
            tables = self._epochs.pop(key, None)
            if tables is None:
                return
            dead = self._unref(tables.parts)
        if tables.relation not in tables.parts:
            self._cursor().execute(f"DROP VIEW IF EXISTS {quote(tables.relation)}")
        self._drop(dead)

    def parts_held(self) -> dict[str, int]:
        with self._lock:
            return dict(self._refs)

    def _unref(self, parts: tuple[str, ...]) -> list[str]:
        dead = []
        for part in parts:
            self._refs[part] -= 1
            if self._refs[part] <= 0:
                del self._refs[part]
                dead.append(part)
        return dead

    def _drop(self, parts: list[str]) -> None:
        for part in parts:
            self._cursor().execute(f"DROP TABLE IF EXISTS {quote(part)}")
