"""Spark partitions of a `danube` read: planned on the driver, read on executors.

`plan_partitions` turns `[start, end)` per topic into read tasks (the pure planner, from the
catalog's topic snapshots) packed into `DanubePartition`s of up to maxPartitionBytes; a stream
plans from its metadata cache and re-plans from etcd when a plan from the cache finds offsets
missing, so a stale cache delays, never skips. Each partition carries everything its
executor needs (`read_partition`): no etcd on executors.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Iterator, Mapping, Sequence

from pyspark.sql.datasource import InputPartition

from connectors.options import DanubeOptions
from connectors.read_task import ReadTask
from danube_core.errors import DataLossError

if TYPE_CHECKING:
    import pyarrow as pa

    from connectors.catalog import TopicCatalog
    from connectors.planner import PlanResult

logger = logging.getLogger(__name__)


class DanubePartition(InputPartition):
    """One Spark partition: read tasks packed up to maxPartitionBytes (picklable, plain data)."""

    def __init__(self, index: int, tasks: Sequence[ReadTask], loss_record: str | None = None,
                 loss_storage_options: dict | None = None) -> None:
        super().__init__(index)
        self.tasks = tuple(tasks)
        self.loss_record = loss_record  # where offsets skipped here are recorded (connectors.loss_records)
        self.loss_storage_options = loss_storage_options or {}

    def __repr__(self) -> str:
        ranges = ", ".join(f"{t.topic} [{t.start_offset}, {t.end_offset}) from {t.source}" for t in self.tasks[:3])
        more = f" and {len(self.tasks) - 3} more" if len(self.tasks) > 3 else ""
        return f"DanubePartition({ranges}{more})"


def plan_partitions(
    catalog: "TopicCatalog", options: DanubeOptions, start: Mapping[str, int], end: Mapping[str, int],
    skipped: dict[str, int] | None = None, *, recheck: "TopicCatalog | None" = None,
) -> list[DanubePartition]:
    """Partitions reading `[start[t], end[t])` of every topic of `end` (start covers them all).

    With failOnDataLoss=false, the offsets skipped per topic are added to `skipped`.
    `recheck`: a catalog reading etcd itself, when `catalog` reads a cache. A plan from the
    cache that finds offsets missing (a descriptor the cache has not seen yet, while retention
    already removed those WAL frames) is made again from etcd, which alone decides data loss.
    """
    from connectors.planner import pack_tasks

    wanted = {t: e for t, e in end.items() if e != start[t]}
    if not wanted:
        return []
    try:
        plan = _plan(catalog, options, start, wanted)
    except DataLossError as exc:
        if recheck is None:
            raise
        logger.info("plan from the metadata cache finds offsets missing (%s); re-planning from etcd", exc)
        plan = _plan(recheck, options, start, wanted)
    else:
        if plan.lost and recheck is not None:
            logger.info("plan from the metadata cache finds offsets missing (%s); re-planning from etcd",
                        plan.lost_offsets)
            plan = _plan(recheck, options, start, wanted)
    if plan.lost:
        logger.warning("skipping lost offsets per topic (failOnDataLoss=false): %s", plan.lost_offsets)
        if skipped is not None:
            for topic, count in plan.lost_offsets.items():
                skipped[topic] = skipped.get(topic, 0) + count
    return [DanubePartition(i, group) for i, group in enumerate(pack_tasks(plan.tasks, options.max_partition_bytes))]


def _plan(catalog: "TopicCatalog", options: DanubeOptions, start: Mapping[str, int],
          wanted: dict[str, int]) -> "PlanResult":
    from connectors.planner import plan_tasks

    begin = {t: min(start[t], e) for t, e in wanted.items()}
    snapshots = catalog.snapshots(begin, {t: max(start[t], e) for t, e in wanted.items()})
    return plan_tasks(
        snapshots, {t: start[t] for t in wanted}, wanted,
        max_partition_bytes=options.max_partition_bytes,
        fail_on_data_loss=options.fail_on_data_loss,
    )


def read_partition(partition: InputPartition, include_source: bool,
                   columns: tuple[str, ...] | None = None) -> Iterator["pa.RecordBatch"]:
    """Executor side: the partition's messages as Arrow batches in the Spark schema, or in the
    `columns` of it a query asked for (`connectors.schema.projected_columns`): only what
    those are built from is decoded."""
    if not isinstance(partition, DanubePartition):
        return  # Spark's placeholder when a batch plan has no partitions
    from connectors.schema import decoded_columns, spark_schema, to_spark_batch
    from connectors.task_reader import read_task
    from connectors.worker_heap import freeze_long_lived

    if columns is None:
        columns = tuple(spark_schema(include_source).names)
    # offset always: the reader checks continuity with it, and a batch's row count rides on it
    decode = ("offset", *(name for name in decoded_columns(columns) if name != "offset"))
    lost: list = []
    on_loss = lost.append if partition.loss_record is not None else None
    for task in partition.tasks:
        source = task.source if include_source else None
        for raw in read_task(task, decode, on_loss=on_loss):
            if raw.num_rows:
                yield to_spark_batch(raw, task.topic, source, columns)
    if lost:
        from connectors.loss_records import write_record

        assert partition.loss_record is not None
        write_record(partition.loss_record, partition.loss_storage_options, lost)
    freeze_long_lived()  # the worker's imports stay out of its per-task gc.collect()
