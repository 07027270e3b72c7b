"""Loads one LoadPlan into the worker's in-memory DuckDB: exactly the plan's files, no listing.

Local files are read by DuckDB's own Parquet reader (parallel, one statement per group of
files sharing partition values); other URLs (s3://...) are pulled through fsspec with the
worker's `storage_options` and appended as Arrow. Delta keeps partition values out of the
files: they are added as typed columns from `DataFile.partition_values` ("" is null). The
table's columns follow the plan's Arrow schema; a file missing a column (schema evolution)
reads it as null. A table becomes visible under its name only once fully loaded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from speedlayer.api.v1 import control_plane_service_pb2 as cp

if TYPE_CHECKING:
    import duckdb

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadResult:
    rows: int
    bytes: int
    seconds: float
    memory_bytes: int


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def plan_files(plan: cp.LoadPlan) -> list[cp.DataFile]:
    kind = plan.source.WhichOneof("source_type")
    if kind == "delta":
        return list(plan.source.delta.files)
    if kind == "iceberg":
        return list(plan.source.iceberg.files)
    raise ValueError(f"plan {plan.plan_id}: source {kind!r} cannot be loaded by this worker")


class EpochLoader:
    """One DuckDB database per worker with `memory_limit_bytes` and `threads`."""

    def __init__(self, *, memory_limit_bytes: int, threads: int,
                 storage_options: dict[str, dict] | None = None) -> None:
        import duckdb

        config: dict[str, str | bool | int | float | list[str]] = {
            "threads": str(max(1, threads)), "preserve_insertion_order": "false"}
        if memory_limit_bytes > 0:
            config["memory_limit"] = f"{max(64, memory_limit_bytes // (1024 * 1024))}MB"
        self._db = duckdb.connect(":memory:", config=config)
        self._lock = threading.Lock()
        self._storage_options = storage_options or {}

    def cursor(self):
        return self._db.cursor()

    def load(self, plan: cp.LoadPlan, files: list[cp.DataFile] | None = None, table_name: str | None = None) -> LoadResult:
        """Load `files` (default: the plan's full list) into `table_name` (default: the plan's
        destination); the table appears under its name only once every file is in."""
        started = time.perf_counter()
        schema = pa.ipc.read_schema(pa.py_buffer(plan.arrow_schema))
        files = plan_files(plan) if files is None else files
        name = table_name or plan.destination_table_name
        table, staging = quote(name), quote(name + "__loading")
        con = self._db.cursor()
        con.execute(f"DROP TABLE IF EXISTS {staging}")
        empty = pa.Table.from_batches([], schema=schema)  # noqa: F841 (read by DuckDB by name)
        con.execute(f"CREATE TABLE {staging} AS SELECT * FROM empty")
        types = {row[0]: row[1] for row in con.execute(f"DESCRIBE {staging}").fetchall()}
        partition_columns = set(plan.partition_columns)
        local = [f for f in files if "://" not in f.uri]
        remote = [f for f in files if "://" in f.uri]
        for values, group in _by_partition(local, partition_columns).items():
            self._insert_local(con, staging, schema, types, dict(values), group)
        for data_file in remote:
            self._insert_remote(con, staging, schema, data_file, partition_columns)
        with self._lock:
            con.execute(f"DROP TABLE IF EXISTS {table}")
            con.execute(f"ALTER TABLE {staging} RENAME TO {table}")
        rows = _one_row(con.execute(f"SELECT count(*) FROM {table}"))[0]
        return LoadResult(rows=rows, bytes=sum(f.size_bytes for f in files),
                          seconds=time.perf_counter() - started, memory_bytes=self.memory_bytes())

    @staticmethod
    def _insert_local(con, staging: str, schema: pa.Schema, types: dict[str, str],
                      values: dict[str, str], group: list[cp.DataFile]) -> None:
        columns = []
        for field in schema:
            if field.name in values:
                columns.append(f"CAST(NULLIF({literal(values[field.name])}, '') AS {types[field.name]}) AS {quote(field.name)}")
            else:
                columns.append(quote(field.name))
        paths = ", ".join(literal(f.uri) for f in group)
        con.execute(f"INSERT INTO {staging} SELECT {', '.join(columns)} "
                    f"FROM read_parquet([{paths}], union_by_name = true)")

    def _insert_remote(self, con, staging: str, schema: pa.Schema, data_file: cp.DataFile,
                       partition_columns: set[str]) -> None:
        import fsspec
        import pyarrow.parquet as pq

        protocol = data_file.uri.split("://", 1)[0]
        fs = fsspec.filesystem(protocol, **self._storage_options.get(protocol, {}))
        with fs.open(data_file.uri, "rb") as handle:
            arrow = pq.read_table(handle)
        columns = []
        for field in schema:
            if field.name in partition_columns:
                raw = data_file.partition_values.get(field.name, "")
                column = pa.array([raw or None] * arrow.num_rows, pa.string()).cast(field.type)
            elif field.name in arrow.column_names:
                column = arrow[field.name].cast(field.type)
            else:
                column = pa.nulls(arrow.num_rows, field.type)
            columns.append(column)
        batch = pa.Table.from_arrays(columns, schema=schema)  # noqa: F841 (read by DuckDB by name)
        con.execute(f"INSERT INTO {staging} SELECT * FROM batch")

    def drop(self, table_name: str) -> None:
        with self._lock:
            self._db.cursor().execute(f"DROP TABLE IF EXISTS {quote(table_name)}")

    def count(self, table_name: str) -> int:
        return _one_row(self._db.cursor().execute(f"SELECT count(*) FROM {quote(table_name)}"))[0]

    def memory_bytes(self) -> int:
        try:
            row = _one_row(self._db.cursor().execute("SELECT sum(memory_usage_bytes) FROM duckdb_memory()"))
            return int(row[0] or 0)
        except Exception:  # older DuckDB without duckdb_memory(): memory is not reported
            return 0


def _one_row(cursor: duckdb.DuckDBPyConnection) -> tuple[Any, ...]:
    """The row of an aggregate query (count, sum), which always returns exactly one."""
    row = cursor.fetchone()
    assert row is not None, "an aggregate query returns one row"
    return row


def _by_partition(files: list[cp.DataFile], columns: set[str]) -> dict[tuple, list[cp.DataFile]]:
    groups: dict[tuple, list[cp.DataFile]] = defaultdict(list)
    for data_file in files:
        key = tuple(sorted((c, data_file.partition_values.get(c, "")) for c in columns))
        groups[key].append(data_file)
    return groups
