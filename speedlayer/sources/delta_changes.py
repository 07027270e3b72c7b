"""What changed in a Delta table since a held epoch: an increment (files added) or a rebuild.

Pure: the held epoch's LoadPlan and the table resolved at its new version in, a `TableChange`
out. The test is on the live file sets that delta-rs replays from the log, not on commitInfo
(optional, and written by each engine its own way): the new version is an increment of the
held one exactly when every file of the held epoch is still live (no `remove` survived between
them) and the schema and partitioning are unchanged. Then the new epoch's rows are the held
epoch's plus those of the added files, so a worker holding it loads only those. Anything else
(OPTIMIZE, DELETE, MERGE, overwrite, a schema change, RESTORE) is a rebuild: the whole new
version, loaded beside the held epoch and swapped in when READY. Tables whose files do not hold
their rows (deletion vectors) never get here: resolving them is refused, as in admission.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from speedlayer.api.v1 import control_plane_service_pb2 as cp
from speedlayer.sources import ResolvedTable

INCREMENTAL, REBUILD = "incremental", "rebuild"


@dataclass(frozen=True)
class TableChange:
    """`kind` INCREMENTAL (with `added` files, possibly none) or REBUILD (with the `reason`)."""

    kind: str
    reason: str = ""
    added: list[cp.DataFile] = field(default_factory=list)
    removed_count: int = 0

    @property
    def incremental(self) -> bool:
        return self.kind == INCREMENTAL


def _schema(raw: bytes) -> pa.Schema | None:
    try:
        return pa.ipc.read_schema(pa.py_buffer(raw))
    except (pa.ArrowInvalid, ValueError):
        return None


def classify(held: cp.LoadPlan, new: ResolvedTable) -> TableChange:
    """How to get from the epoch `held` (its full plan) to `new` (the table at a later version)."""
    if held.source.WhichOneof("source_type") != "delta" or new.source.WhichOneof("source_type") != "delta":
        return TableChange(REBUILD, "not a Delta epoch")
    before, after = held.source.delta, new.source.delta
    if before.table_uri != after.table_uri:
        return TableChange(REBUILD, f"the dataset now follows {after.table_uri} (was {before.table_uri})")
    if after.version <= before.version:
        return TableChange(REBUILD, f"version {after.version} is not after the held version {before.version}")
    if list(held.partition_columns) != list(new.partition_columns):
        return TableChange(REBUILD, f"partition columns changed: {list(held.partition_columns)} -> "
                                    f"{list(new.partition_columns)}")
    old_schema, new_schema = _schema(held.arrow_schema), _schema(new.arrow_schema)
    if old_schema is None or new_schema is None or not old_schema.equals(new_schema):
        return TableChange(REBUILD, "the table's schema changed")
    live = {f.uri for f in after.files}
    removed = sum(1 for f in before.files if f.uri not in live)
    if removed:
        return TableChange(REBUILD, f"{removed} of the held epoch's {len(before.files)} files were removed "
                                    f"between versions {before.version} and {after.version}",
                           removed_count=removed)
    known = {f.uri for f in before.files}
    return TableChange(INCREMENTAL, added=[f for f in after.files if f.uri not in known])


def incremental_source(new: ResolvedTable, change: TableChange) -> cp.DataSource:
    """The new epoch's DataSource: every live file (for a worker loading it whole) and the
    added ones (for a worker holding the base epoch)."""
    source = cp.DataSource()
    source.CopyFrom(new.source)
    if change.incremental:
        source.delta.added_files.extend(change.added)
    return source
