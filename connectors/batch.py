"""Batch reads, and the driver-side lookups batch and streaming reads share.

Planning runs on the driver: resolve the topics, turn the starting/ending options into
end-exclusive positions, and plan partitions (`connectors.partitions`). A batch read reads
etcd once, through a catalog of its own (`open_catalog`); a stream reads through its metadata
cache (`connectors.stream`, `connectors.query_scope`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Iterator, Sequence

from pyspark.sql.datasource import DataSourceReader, InputPartition

from connectors.offsets import resolve_end, resolve_start
from connectors.options import FAIL_ON_MISSING_TOPIC, DanubeOptions
from connectors.partitions import DanubePartition, plan_partitions, read_partition
from connectors.plain_errors import plain_config_errors, plain_iteration
from danube_core import keys
from danube_core.errors import ConfigError
from danube_core.topics import TopicName

if TYPE_CHECKING:
    import pyarrow as pa

    from connectors.catalog import TopicCatalog
    from danube_core.local_cache import LocalCache
    from danube_core.metadata import MetadataStore

logger = logging.getLogger(__name__)

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


class MissingTopics:
    """Explicitly named topics the namespace index does not list: a typo, or a topic not
    created yet. Each is named once (WARNING, with the topics its namespace has), or fails the
    read with failOnMissingTopic=true; `now` says which are missing at the last check."""

    def __init__(self, options: DanubeOptions) -> None:
        self._options = options
        self._named: set[str] = set()
        self.now: list[str] = []

    def check(self, catalog: "TopicCatalog", topics: Sequence[str]) -> list[str]:
        """The topics of `topics` that exist; the others are named (once) or refused."""
        if self._options.topics is None:
            self.now = []
            return list(topics)
        present = catalog.indexed(topics)
        self.now = [t for t in topics if t not in present]
        for topic in self.now:
            if topic not in self._named:
                self._name(catalog, topic)
        return [t for t in topics if t in present]

    def _name(self, catalog: "TopicCatalog", topic: str) -> None:
        name = TopicName.parse(topic)
        known = [str(t) for t in catalog.namespace_topics(name.namespace)]
        listed = ", ".join(known[:MISSING_TOPICS_LISTED]) + (" ..." if len(known) > MISSING_TOPICS_LISTED else "")
        text = (f"topic {topic} does not exist (no {keys.namespace_topic_key(name)}); namespace "
                f"{name.namespace} has {len(known)} topic(s){': ' + listed if known else ''}")
        if self._options.fail_on_missing_topic:
            raise ConfigError(f"option '{FAIL_ON_MISSING_TOPIC}'=true: {text}")
        logger.warning("%s. It is read once it is created (option %s=true fails instead).", text, FAIL_ON_MISSING_TOPIC)
        self._named.add(topic)


MISSING_TOPICS_LISTED = 20


def topics_of(catalog: "TopicCatalog", options: DanubeOptions) -> list[str]:
    """The topic partitions the options select, as broker names, in a stable order."""
    resolved = catalog.resolve_topics(
        list(options.topics) if options.topics is not None else None,
        options.topic_pattern,
        options.namespace,
    )
    return [str(topic) for topic in resolved]


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
            MissingTopics(self.options).check(catalog, topics)
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
        return plain_iteration(read_partition(partition, self.options.include_source, self.options.columns))
