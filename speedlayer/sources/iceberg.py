"""Iceberg tables through `pyiceberg` catalogs (the seed's lakehouse source).

`catalogs` maps a catalog name (the request's `iceberg_table.catalog`) to pyiceberg catalog
properties, e.g. `{"type": "sql", "uri": "sqlite:///catalog.db", "warehouse": "file:///wh"}`.
A table resolves to its current snapshot's data files (size, row count). Iceberg writes
partition columns into the data files, so the plan lists no partition columns; a partition
filter keeps files whose identity-partition values match. A snapshot with delete files
(row-level deletes) is refused with `PreconditionError`: its data files alone are not the table.
"""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa

from speedlayer.api.v1 import control_plane_service_pb2 as cp
from speedlayer.api.v1 import management_service_pb2 as mg
from speedlayer.errors import InvalidRequestError, PreconditionError, SourceError
from speedlayer.sources import PartitionFilter, ResolvedTable, TableSource, check_partition_columns, matches


def _local(uri: str) -> str:
    return uri[len("file://"):] if uri.startswith("file://") else uri


class IcebergTableSource(TableSource):
    def __init__(self, catalogs: dict[str, dict[str, Any]]) -> None:
        self._properties = {name: {k: str(v) for k, v in props.items()} for name, props in catalogs.items()}
        self._catalogs: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _catalog(self, name: str):
        from pyiceberg.catalog import load_catalog

        if name not in self._properties:
            raise InvalidRequestError(f"iceberg_table.catalog {name!r}: not configured (known: {sorted(self._properties)})")
        with self._lock:
            if name not in self._catalogs:
                self._catalogs[name] = load_catalog(name, **self._properties[name])
            return self._catalogs[name]

    def resolve(self, source: mg.DataSourceIdentifier, partitions: PartitionFilter) -> ResolvedTable:
        from pyiceberg.exceptions import NoSuchTableError

        request = source.iceberg_table
        identifier = f"{request.database}.{request.table}"
        try:
            table = self._catalog(request.catalog).load_table(identifier)
        except NoSuchTableError as exc:
            raise PreconditionError(f"no Iceberg table {identifier} in catalog {request.catalog}") from exc
        except (OSError, ValueError) as exc:
            raise SourceError(f"loading Iceberg table {identifier} failed: {exc}") from exc
        snapshot = table.current_snapshot()
        spec = table.spec()
        names = [table.schema().find_field(f.source_id).name for f in spec.fields
                 if str(f.transform) == "identity"]
        check_partition_columns(partitions, names, identifier)
        files = []
        for task in (table.scan().plan_files() if snapshot is not None else []):
            if task.delete_files:
                raise PreconditionError(f"Iceberg table {identifier} snapshot {snapshot.snapshot_id} has delete "
                                        "files (row-level deletes): its data files alone are not the table")
            data = task.file
            values = {n: str(data.partition[i]) for i, n in enumerate(names)} if names else {}
            if not matches(values, partitions):
                continue
            files.append(cp.DataFile(uri=_local(data.file_path), format=str(data.file_format.name).lower(),
                                     size_bytes=data.file_size_in_bytes, record_count=data.record_count,
                                     partition_values=values))
        schema = pa.schema([f.remove_metadata() for f in table.schema().as_arrow()])
        snapshot_id = str(snapshot.snapshot_id) if snapshot is not None else "0"
        iceberg = cp.IcebergSource(table_name=f"{request.catalog}.{identifier}", snapshot_id=snapshot_id, files=files)
        return ResolvedTable(
            identity=f"iceberg:{request.catalog}.{identifier}", version=snapshot.sequence_number if snapshot else 0,
            source=cp.DataSource(iceberg=iceberg), arrow_schema=schema.serialize().to_pybytes(),
            partition_columns=[], total_rows=sum(f.record_count for f in files),
            total_bytes=sum(f.size_bytes for f in files), file_count=len(files),
        )
