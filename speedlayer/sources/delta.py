"""Delta tables through their transaction log, without Spark (the `deltalake` package).

A version resolves to its live `add` files with size, row count and partition values, the
commit time, and the Arrow schema. A table this speed layer cannot read faithfully from its
Parquet files alone is refused with `PreconditionError` (FAILED_PRECONDITION): deletion vectors
(rows deleted outside the files) and column mapping (physical column names differ).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING
from urllib.parse import unquote

import pyarrow as pa

from speedlayer.api.v1 import control_plane_service_pb2 as cp
from speedlayer.api.v1 import management_service_pb2 as mg
from speedlayer.errors import InvalidRequestError, PreconditionError, SourceError
from speedlayer.sources import (
    PartitionFilter, ResolvedTable, TableSource, check_partition_columns, matches,
)

if TYPE_CHECKING:
    from deltalake import DeltaTable

logger = logging.getLogger(__name__)

# Reader features whose meaning is not in the Parquet files themselves.
UNFAITHFUL_READER_FEATURES = {"deletionVectors", "columnMapping"}


def normalize_table_uri(uri: str) -> str:
    """Local paths (and file://) become absolute paths; other URIs keep their scheme."""
    uri = uri.strip()
    if not uri:
        raise InvalidRequestError("delta_table.table_uri is empty")
    if uri.startswith("file://"):
        uri = uri[len("file://"):]
    if "://" not in uri:
        return os.path.abspath(uri)
    return uri.rstrip("/")


def file_uri(table_uri: str, path: str) -> str:
    """An `add.path` (URL-encoded, relative to the table or absolute) as a loadable URI."""
    if "://" in path:
        return path[len("file://"):] if path.startswith("file://") else path
    return f"{table_uri}/{unquote(path)}"


class DeltaTableSource(TableSource):
    """`storage_options` go to delta-rs (e.g. AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID for S3)."""

    def __init__(self, storage_options: dict[str, str] | None = None) -> None:
        self._storage_options = dict(storage_options or {})
        self._lock = threading.Lock()
        self._latest: dict[str, DeltaTable] = {}  # table URI -> a DeltaTable without files (polling)

    def resolve(self, source: mg.DataSourceIdentifier, partitions: PartitionFilter) -> ResolvedTable:
        request = source.delta_table
        return self.resolve_uri(normalize_table_uri(request.table_uri),
                                request.version if request.pin_version else None, partitions)

    def resolve_uri(self, table_uri: str, version: int | None, partitions: PartitionFilter) -> ResolvedTable:
        """`table_uri` (normalized) at `version` (None: the latest) as a ResolvedTable."""
        table = self._open(table_uri, version)
        self._check_faithful(table, table_uri)
        metadata = table.metadata()
        columns = list(metadata.partition_columns)
        check_partition_columns(partitions, columns, table_uri)
        schema = pa.schema(table.schema().to_arrow())
        version = table.version()
        files = [f for f in self._files(table, table_uri, columns) if matches(dict(f.partition_values), partitions)]
        delta = cp.DeltaSource(table_uri=table_uri, version=version,
                               commit_timestamp_ms=self._commit_ms(table), files=files)
        return ResolvedTable(
            identity=f"delta:{table_uri}", version=version, source=cp.DataSource(delta=delta),
            arrow_schema=schema.serialize().to_pybytes(), partition_columns=columns,
            total_rows=sum(f.record_count for f in files), total_bytes=sum(f.size_bytes for f in files),
            file_count=len(files),
        )

    def latest_version(self, table_uri: str) -> int:
        """The table's newest version: one cached log handle per table, brought up to date by
        reading only the commits after the last one it saw (cheap enough to poll)."""
        with self._lock:
            table = self._latest.get(table_uri)
        if table is None:
            table = self._open(table_uri, None, without_files=True)
        else:
            try:
                table.update_incremental()
            except Exception as exc:  # translated like any other log read
                raise SourceError(f"reading the Delta log of {table_uri} failed: {exc}") from exc
        with self._lock:
            self._latest[table_uri] = table
        return table.version()

    def operations(self, table_uri: str, after: int, upto: int) -> list[str]:
        """The commitInfo operations of versions (after, upto], oldest first (for the audit
        trail only: what a rebuild or an increment stands for; never used to classify)."""
        if upto <= after:
            return []
        try:
            history = self._open(table_uri, None, without_files=True).history(upto - after)
        except Exception as exc:  # informative only
            logger.debug("no history for %s: %s", table_uri, exc)
            return []
        found = {int(h.get("version", -1)): str(h.get("operation", "?")) for h in history}
        return [f"{v}:{found[v]}" for v in sorted(found) if after < v <= upto]

    def _open(self, table_uri: str, version: int | None, without_files: bool = False) -> DeltaTable:
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError, TableNotFoundError

        try:
            return DeltaTable(table_uri, version=version, storage_options=self._storage_options or None,
                              without_files=without_files)
        except TableNotFoundError as exc:
            raise PreconditionError(f"no Delta table at {table_uri}: {exc}") from exc
        except DeltaError as exc:
            text = str(exc)
            if version is not None and "version" in text.lower():
                raise PreconditionError(f"Delta table {table_uri} has no version {version}: {text}") from exc
            raise SourceError(f"reading the Delta log of {table_uri} failed: {text}") from exc
        except OSError as exc:
            raise SourceError(f"reading the Delta log of {table_uri} failed: {exc}") from exc

    @staticmethod
    def _check_faithful(table, table_uri: str) -> None:
        features = set(table.protocol().reader_features or ())
        refused = sorted(features & UNFAITHFUL_READER_FEATURES)
        mode = table.metadata().configuration.get("delta.columnMapping.mode", "none")
        if mode != "none":
            refused.append(f"columnMapping mode {mode}")
        if refused:
            raise PreconditionError(
                f"Delta table {table_uri} (version {table.version()}) uses {', '.join(refused)}: "
                "its Parquet files alone do not hold the table's rows, so it cannot be loaded faithfully"
            )

    @staticmethod
    def _files(table, table_uri: str, columns: list[str]) -> list[cp.DataFile]:
        actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
        files = []
        for action in actions:
            values = {c: action.get(f"partition.{c}") for c in columns}
            files.append(cp.DataFile(
                uri=file_uri(table_uri, action["path"]), format="parquet",
                size_bytes=int(action["size_bytes"]), record_count=int(action.get("num_records") or 0),
                # Delta's null partition value has no string form; "" is never a Delta value
                # for a non-string column, and workers read "" of any column as null.
                partition_values={c: ("" if v is None else str(v)) for c, v in values.items()},
            ))
        return files

    @staticmethod
    def _commit_ms(table) -> int:
        try:
            history = table.history(1)
            return int(history[0].get("timestamp", 0)) if history else 0
        except Exception as exc:  # history is informative only; a log without it still loads
            logger.debug("no commit time for %s: %s", table.table_uri, exc)
            return 0
