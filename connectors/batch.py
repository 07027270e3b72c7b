"""Batch reads, and the pieces batch and streaming reads share.

Planning runs on the driver: resolve the topics, turn the starting/ending options into
end-exclusive positions, snapshot the topics (descriptors by key range, sealed state, WAL
head) and let the pure planner cut `[start, end)` into `ReadTask`s. A batch read reads etcd
once; a stream reads through a `LocalCache` (see `connectors.stream`) and re-plans from etcd
when a plan made from the cache finds offsets missing, so a stale cache delays, never skips. Each Spark partition
carries one task, so executors read their object byte range or WAL run without etcd and
convert the decoded Arrow batches to the Spark schema (`read()` yields Arrow batches).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Iterator, Mapping, Sequence

from pyspark.sql.datasource import DataSourceReader, InputPartition

from connectors.offsets import resolve_end, resolve_start
from connectors.options import DanubeOptions
from connectors.plain_errors import plain_config_errors, plain_iteration
from connectors.read_task import ReadTask
from danube_core.errors import DataLossError

if TYPE_CHECKING:
    import pyarrow as pa

    from connectors.catalog import TopicCatalog
    from connectors.planner import PlanResult
    from danube_core.local_cache import LocalCache
    from danube_core.metadata import MetadataStore

logger = logging.getLogger(__name__)

# Decoder columns the Spark schema is built from (the others are never decoded into Arrow).
READ_COLUMNS = (
    "offset", "producer_id", "payload", "publish_time", "producer_name", "attributes",
    "schema_id", "schema_version",
)


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


def open_catalog(options: DanubeOptions) -> tuple["TopicCatalog", "MetadataStore"]:
    """The driver's catalog and the etcd connection behind it (close the store when done)."""
    metadata = options.etcd.connect()
    return new_catalog(options, metadata), metadata


def new_catalog(options: DanubeOptions, reader: "MetadataStore | LocalCache") -> "TopicCatalog":
    """A catalog reading etcd keys from `reader`: the store itself, or a cache of it (the
    catalog only reads, through `get`, `get_range` and `get_prefix`)."""
    from connectors.catalog import TopicCatalog

    return TopicCatalog(
        reader,  # type: ignore[arg-type]  # a LocalCache has MetadataStore's read half
        root_prefix=options.root_prefix,
        storage_url=options.storage_url,
        storage_options=dict(options.storage_options),
        wal_root=options.wal_root,
        fail_on_data_loss=options.fail_on_data_loss,
    )


def topics_of(catalog: "TopicCatalog", options: DanubeOptions) -> list[str]:
    """The topic partitions the options select, as broker names, in a stable order."""
    resolved = catalog.resolve_topics(
        list(options.topics) if options.topics is not None else None,
        options.topic_pattern,
        options.namespace,
    )
    return [str(topic) for topic in resolved]


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


def read_partition(partition: InputPartition, include_source: bool) -> Iterator["pa.RecordBatch"]:
    """Executor side: the partition's messages as Arrow batches in the Spark schema."""
    if not isinstance(partition, DanubePartition):
        return  # Spark's placeholder when a batch plan has no partitions
    from connectors.schema import to_spark_batch
    from connectors.task_reader import read_task
    from connectors.worker_heap import freeze_long_lived

    lost: list = []
    on_loss = lost.append if partition.loss_record is not None else None
    for task in partition.tasks:
        source = task.source if include_source else None
        for raw in read_task(task, READ_COLUMNS, on_loss=on_loss):
            if raw.num_rows:
                yield to_spark_batch(raw, task.topic, source)
    if lost:
        from connectors.loss_records import write_record

        assert partition.loss_record is not None
        write_record(partition.loss_record, partition.loss_storage_options, lost)
    freeze_long_lived()  # the worker's imports stay out of its per-task gc.collect()


class DanubeBatchReader(DataSourceReader):
    """`spark.read.format("danube")`: reads `[startingOffsets, endingOffsets)` once."""

    def __init__(self, options: DanubeOptions) -> None:
        options.require_batch()
        self.options = options

    @plain_config_errors
    def partitions(self) -> list[InputPartition]:
        catalog, metadata = open_catalog(self.options)
        try:
            if self.options.salvage is not None:
                return self._salvage_partitions(catalog)
            topics = topics_of(catalog, self.options)
            start = resolve_start(self.options.starting_for(streaming=False), topics, catalog, self.options.subscription)
            end = resolve_end(self.options.ending, topics, catalog)
            partitions = plan_partitions(catalog, self.options, start, end)
        finally:
            metadata.close()
        logger.info("batch read of %d topic(s) %s -> %s in %d partition(s)", len(topics), start, end, len(partitions))
        return list(partitions)

    def _salvage_partitions(self, catalog: "TopicCatalog") -> list[InputPartition]:
        from connectors.salvage import salvage_tasks

        assert self.options.topics is not None and self.options.salvage is not None  # parse_options
        tasks = salvage_tasks(catalog, self.options.topics[0], self.options.salvage,
                              fail_on_data_loss=self.options.fail_on_data_loss)
        logger.info("salvage read of %s from %s: %d run(s)", self.options.topics[0],
                    ", ".join(self.options.salvage), len(tasks))
        return [DanubePartition(i, [task]) for i, task in enumerate(tasks)]

    def read(self, partition: InputPartition) -> Iterator["pa.RecordBatch"]:
        return plain_iteration(read_partition(partition, self.options.include_source))
