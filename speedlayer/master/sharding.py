"""Shard planning: an epoch too big for one worker becomes shards, each a subset of its files.

Pure arithmetic (files and limits in, shards out), run by the Admission Controller before
anything of the epoch is persisted. An epoch is split when its estimated memory exceeds the
shard limit: the tenant's `shard_max_bytes`, else `WORKER_SHARE` of its smallest registered
worker's memory (what one worker should hold of one epoch, leaving room for DuckDB's working
memory and for other epochs). The shard count is the fewest shards of at most the limit each:

* a partitioned table is split by partition values: every partition's files go to one shard,
  partitions packed largest first onto the lightest shard, so a query filtering a partition
  column reads only the shards holding those values (a partition bigger than the limit alone
  is split by files, and its values then sit in several shards);
* an unpartitioned table is split into file groups of similar size (largest file first onto
  the lightest group). A file is never split, so a shard may exceed the limit by at most one file.

More shards than the tenant has workers is refused: the shards would not be any smaller per
worker than the epoch, and the numbers are in the error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from speedlayer.api.v1 import control_plane_service_pb2 as cp
from speedlayer.errors import PreconditionError

WORKER_SHARE = 0.8  # of the smallest worker's memory, one shard at most (the default limit)


@dataclass(frozen=True)
class ShardPlan:
    """One shard: its files, their estimated memory and the partition values they hold."""

    files: tuple[cp.DataFile, ...]
    estimated_bytes: int
    values: dict[str, list[str]] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return sum(f.record_count for f in self.files)


def shard_limit(tenant_shard_max_bytes: int, worker_memory_bytes: list[int]) -> int:
    """The most one shard should hold (0: no limit known, never shard)."""
    if tenant_shard_max_bytes > 0:
        return tenant_shard_max_bytes
    reported = [m for m in worker_memory_bytes if m > 0]
    return int(min(reported) * WORKER_SHARE) if reported else 0


def source_files(source: cp.DataSource) -> list[cp.DataFile]:
    """The files a full load of `source` reads."""
    kind = source.WhichOneof("source_type")
    return list(source.delta.files) if kind == "delta" else list(source.iceberg.files) if kind == "iceberg" else []


def with_files(source: cp.DataSource, files: tuple[cp.DataFile, ...]) -> cp.DataSource:
    """`source` narrowed to `files` (a shard's plan)."""
    narrowed = cp.DataSource()
    narrowed.CopyFrom(source)
    target = narrowed.delta if source.WhichOneof("source_type") == "delta" else narrowed.iceberg
    del target.files[:]
    target.files.extend(files)
    return narrowed


def plan_shards(files: list[cp.DataFile], partition_columns: list[str], estimated_bytes: int, limit: int,
                workers: int, where: str) -> list[ShardPlan]:
    """The shards of an epoch of `files` estimated at `estimated_bytes` in memory ([] when it fits
    within `limit` whole, or `limit` is 0). `workers`: the tenant's registered workers; more shards
    than that raise PreconditionError naming the numbers (`where` names the epoch)."""
    if limit <= 0 or estimated_bytes <= limit or len(files) < 2:
        return []
    on_disk = sum(f.size_bytes for f in files) or 1
    expansion = estimated_bytes / on_disk
    units = _units(files, partition_columns, limit / expansion)
    count = min(math.ceil(estimated_bytes / limit), len(units))
    while True:
        groups = _pack(units, count)
        if max(_size(g) for g in groups) * expansion <= limit or count >= len(units):
            break
        count += 1
    groups = [g for g in groups if g]
    count = len(groups)
    if count > workers:
        raise PreconditionError(
            f"{where} is estimated at {estimated_bytes} bytes in memory, more than one worker should hold "
            f"({limit} bytes per shard): it needs {count} shards but the tenant has {workers} worker(s); "
            f"start {count - workers} more worker(s), give workers more memory, or raise shard_max_bytes "
            f"in the tenant's config")
    return [ShardPlan(files=tuple(group), estimated_bytes=int(_size(group) * expansion),
                      values=_values(group, partition_columns)) for group in groups]


def _size(files: list[cp.DataFile]) -> int:
    return sum(f.size_bytes for f in files)


def _units(files: list[cp.DataFile], partition_columns: list[str], limit_on_disk: float) -> list[list[cp.DataFile]]:
    """What a shard takes whole: one partition's files (split by files if it alone is over the
    limit), or one file of an unpartitioned table."""
    if not partition_columns:
        return [[f] for f in files]
    partitions: dict[tuple[str, ...], list[cp.DataFile]] = {}
    for f in files:
        partitions.setdefault(tuple(f.partition_values.get(c, "") for c in partition_columns), []).append(f)
    units: list[list[cp.DataFile]] = []
    for key in sorted(partitions):
        members = partitions[key]
        if _size(members) <= limit_on_disk or len(members) == 1:
            units.append(members)
        else:
            pieces = max(2, math.ceil(_size(members) / limit_on_disk))
            units += [group for group in _pack([[f] for f in members], pieces) if group]
    return units


def _pack(units: list[list[cp.DataFile]], count: int) -> list[list[cp.DataFile]]:
    """Largest unit first onto the lightest group (ties: the lowest index): deterministic."""
    groups: list[list[cp.DataFile]] = [[] for _ in range(count)]
    sizes = [0] * count
    for unit in sorted(units, key=lambda u: (-_size(u), [f.uri for f in u])):
        index = min(range(count), key=lambda i: (sizes[i], i))
        groups[index] += unit
        sizes[index] += _size(unit)
    return groups


def _values(files: tuple[cp.DataFile, ...] | list[cp.DataFile], partition_columns: list[str]) -> dict[str, list[str]]:
    return {c: sorted({f.partition_values.get(c, "") for f in files}) for c in partition_columns}
