"""Table sources (the seed's §12 `catalog.Connector`): a logical table -> the physical files of one version.

"Catalog" in this project is the connector's topic catalog; the speed layer's readers of Delta
and Iceberg tables are sources (`DeltaTableSource`, `IcebergTableSource`). The admission
controller calls `TableSource.resolve` and turns the `ResolvedTable` into a LoadPlan; it never
contains source-specific logic. The master keeps one source per request kind (`source_kind`);
the seed's OLAP source is refused with `UnsupportedSourceError` (UNIMPLEMENTED).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Mapping

from speedlayer.api.v1 import control_plane_service_pb2 as cp
from speedlayer.api.v1 import management_service_pb2 as mg
from speedlayer.errors import InvalidRequestError

PartitionFilter = list[dict[str, str]]


@dataclass(frozen=True)
class ResolvedTable:
    """One version of a table, as a worker needs it: every field a LoadPlan carries.

    `identity` names the table independently of its version (it goes into the epoch id);
    `source` is the filled-in `DataSource` (files, version); `arrow_schema` is Arrow IPC bytes.
    """

    identity: str
    version: int
    source: cp.DataSource
    arrow_schema: bytes
    partition_columns: list[str] = field(default_factory=list)
    total_rows: int = 0
    total_bytes: int = 0
    file_count: int = 0


class TableSource(ABC):
    """Resolves a request's source into a `ResolvedTable`; raises SpeedLayerError subclasses."""

    @abstractmethod
    def resolve(self, source: mg.DataSourceIdentifier, partitions: PartitionFilter) -> ResolvedTable: ...


def source_kind(source: mg.DataSourceIdentifier) -> str:
    kind = source.WhichOneof("source_type")
    if kind is None:
        raise InvalidRequestError("source: expected one of delta_table, iceberg_table, olap_table")
    return kind


def matches(partition_values: Mapping[str, str | None], wanted: PartitionFilter) -> bool:
    """A file is loaded if `wanted` is empty or one spec's values all equal the file's."""
    return not wanted or any(
        all(partition_values.get(col) == val for col, val in spec.items()) for spec in wanted
    )


def check_partition_columns(wanted: PartitionFilter, columns: list[str], table: str) -> None:
    for spec in wanted:
        unknown = sorted(set(spec) - set(columns))
        if unknown:
            raise InvalidRequestError(
                f"partitions_to_load names {unknown}, which are not partition columns of {table} "
                f"(its partition columns: {columns or 'none'})"
            )
