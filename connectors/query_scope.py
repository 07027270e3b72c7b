"""What one stream's driver holds of etcd: the keys of the topics it reads, nothing more.

A stream plans from a `LocalCache` (`connectors.stream`). Its cost must follow the query's
work, not the cluster's size, so the cache holds, per topic the query reads:

* the topic's storage keys from a *floor* on: descriptors from the floor's key, `cur`, the
  sealed state (`[object_key(floor), end of the topic's storage prefix)`);
* its `/topics/{ns}/{topic}/` keys (subscriptions, cursors, lag records);
* when WAL directories are per broker, the cluster keys naming its owner and WAL roots: the
  registrations, each broker's state record and its assignments of the query's topics (a
  filtered listing of `/cluster/brokers/`);

and the namespace-index entries the query resolves its topics from: an explicit topic's own
entry and its partitions', or the namespace's index for a `namespace`/`topicPattern` query (the
whole index for a pattern without a namespace).

A topic's floor starts at the descriptor `cur` names, so a query on a long history loads its
head, not the history. A query whose position is below the floor (resumed behind the head, or
started from `earliest`) has the floor lowered to its position when that window holds at most
`WINDOW_DESCRIPTORS` descriptors; a longer backlog is read from etcd a batch at a time until
the query reaches the floor. As the query moves on, `advance` raises the floor behind it, so the
cache holds the window from the query's position to the head, whatever the topic's length.

Reads outside what the cache holds (a replayed batch below the floor, a topic the query no
longer resolves) go to etcd through `CachedMetadataStore`: the scope decides cost, never what
a read returns.
"""

from __future__ import annotations

import functools
import logging
from typing import Callable, Iterable, Mapping

from connectors.options import WAL_NONE, DanubeOptions
from danube_core import keys
from danube_core.local_cache import LocalCache
from danube_core.metadata import MetadataStore, prefix_end
from danube_core.records import CurPointer
from danube_core.topics import TopicName

logger = logging.getLogger(__name__)

WINDOW_DESCRIPTORS = 4096  # a backlog below the head up to this many descriptors is cached
# Objects a batch of a stream far behind plans per topic: a long backlog is read a window per
# trigger, each trigger planned in a bounded time (bench/bench_metadata_cache.py "from earliest").
PLAN_WINDOW_OBJECTS = 1024
WATCH_PREFIX = "/"  # storage roots, /topics, /namespaces and /cluster share only the root


class QueryScope:
    """The `LocalCache` of one stream's keys (see the module docstring) and its floors."""

    def __init__(self, store: MetadataStore, options: DanubeOptions, *, name: str) -> None:
        self._store = store
        self._storage = keys.StorageKeys(options.root_prefix)
        self._per_broker = options.wal_root != WAL_NONE
        self._floors: dict[str, int] = {}  # topic -> offset of its lowest cached descriptor key
        self._declined: dict[str, int] = {}  # topic -> an offset whose backlog was too long to cache
        self._restart_declined: dict[str, int] = {}  # topic -> a restarted `cur` too far below to cache
        spans: list[tuple[str, str, Callable[[str], bool] | None]] = [
            (p, prefix_end(p), None) for p in _index_prefixes(options)]
        if self._per_broker:
            spans.append((keys.REGISTER_PREFIX, prefix_end(keys.REGISTER_PREFIX), None))
            spans.append((keys.BROKERS_PREFIX, prefix_end(keys.BROKERS_PREFIX), _is_broker_state))
        self.cache = LocalCache(store, spans=spans, watch_prefix=WATCH_PREFIX, name=name)

    def start(self) -> "QueryScope":
        self.cache.start()
        return self

    def close(self) -> None:
        self.cache.close()

    def follow(self, topics: Iterable[str]) -> None:
        """Cache the keys of topics the query reads from now on (each topic once)."""
        new = [t for t in dict.fromkeys(topics) if t not in self._floors]
        for topic in new:
            name = TopicName.parse(topic)
            floor = self._head_offset(name)
            self.cache.cover(self._floor_key(name, floor), prefix_end(self._storage.topic_prefix(name)))
            self.cache.cover(keys.topic_keys_prefix(name), prefix_end(keys.topic_keys_prefix(name)))
            self._floors[topic] = floor
        if new and self._per_broker:
            paths = frozenset(TopicName.parse(t).storage_path for t in new)
            self.cache.cover(keys.BROKERS_PREFIX, prefix_end(keys.BROKERS_PREFIX),
                             functools.partial(_assigns_one_of, paths))
        if new:
            logger.info("%s: caching the metadata of %d more topic(s): %s", self.cache, len(new), new)

    def forget(self, topics: Iterable[str]) -> None:
        """Stop caching the storage and `/topics` keys of topics the query no longer reads (a
        deleted topic); following one again lists them anew."""
        for topic in topics:
            floor = self._floors.pop(topic, None)
            if floor is None:
                continue
            name = TopicName.parse(topic)
            self.cache.uncover(self._floor_key(name, floor), prefix_end(self._storage.topic_prefix(name)))
            self.cache.uncover(keys.topic_keys_prefix(name), prefix_end(keys.topic_keys_prefix(name)))

    def reach(self, topic: str, offset: int, covering_start: Callable[[str, int], int]) -> None:
        """The query reads `topic` from `offset`: lower the floor there if the window between
        is at most `WINDOW_DESCRIPTORS` descriptors (a longer backlog is asked about once).
        `covering_start(topic, offset)`: the key offset of the descriptor holding `offset`."""
        floor = self._floors.get(topic)
        if floor is None or offset >= floor or offset >= self._declined.get(topic, floor):
            return
        start = covering_start(topic, offset)
        if start < floor and not self._lower(topic, start, floor):
            self._declined[topic] = offset
            logger.info("%s: %s reads from offset %d, more than %d descriptors below the cached head; "
                        "that backlog is read from etcd as the query goes", self.cache, topic, offset,
                        WINDOW_DESCRIPTORS)

    def _lower(self, topic: str, start: int, floor: int) -> bool:
        """Cache `topic`'s descriptors from `start` up to its floor if they are at most
        `WINDOW_DESCRIPTORS` (one bounded listing decides); whether it did."""
        name = TopicName.parse(topic)
        window = self._store.get_range(self._floor_key(name, start), self._floor_key(name, floor),
                                       limit=WINDOW_DESCRIPTORS + 1)
        if len(window) > WINDOW_DESCRIPTORS:
            return False
        self.cache.cover(self._floor_key(name, start), self._floor_key(name, floor))
        self._floors[topic] = start
        self._declined.pop(topic, None)
        return True

    def advance(self, positions: Mapping[str, int]) -> None:
        """Raise each topic's floor to the cached descriptor holding the offset before its
        position (the one a lag measurement still reads), never above the one `cur` names
        (the catalog reads from there), dropping the keys below it."""
        for topic, position in positions.items():
            floor = self._floors.get(topic)
            if floor is None or position <= floor + 1:
                continue
            name = TopicName.parse(topic)
            cur = self._cached_cur(name)
            top = min(position - 1, cur if cur is not None else floor)
            if top <= floor:
                continue
            window = (self._floor_key(name, floor), self._storage.object_key(name, top) + "\0")
            if not self.cache.covers(*window):
                continue  # not cached from the floor up (a listing under way): next trigger
            below = self.cache.get_range(*window)
            start = keys.parse_object_key(below[-1][0]) if below else None
            if start is not None and start > floor:
                self.cache.uncover(self._floor_key(name, floor), self._storage.object_key(name, start))
                self._floors[topic] = start

    def lower_to_restart(self) -> None:
        """A topic whose `cur` went below its floor (a run restarted at a lower offset) has its
        floor lowered there, so its new run's descriptors are cached again."""
        for topic, floor in list(self._floors.items()):
            start = self._cached_cur(TopicName.parse(topic))
            if start is None or start >= floor or self._restart_declined.get(topic) == start:
                continue
            if not self._lower(topic, start, floor):
                self._restart_declined[topic] = start  # asked once per `cur`
                logger.info("%s: %s restarted at offset %d, more than %d descriptors below the cached "
                            "ones; they are read from etcd", self.cache, topic, start, WINDOW_DESCRIPTORS)

    def _cached_cur(self, name: TopicName) -> int | None:
        raw = self.cache.get(self._storage.cur_key(name))
        return int(CurPointer.from_json(raw, self._storage.cur_key(name)).start) if raw is not None else None

    def _head_offset(self, name: TopicName) -> int:
        """Offset of the descriptor `cur` names, 0 without `cur` (the whole prefix is cached)."""
        raw = self._store.get(self._storage.cur_key(name))
        return int(CurPointer.from_json(raw, self._storage.cur_key(name)).start) if raw is not None else 0

    def _floor_key(self, name: TopicName, floor: int) -> str:
        # From offset 0 the span starts at the prefix itself (a non-padded key would sort first).
        return self._storage.object_key(name, floor) if floor else self._storage.objects_prefix(name)


def _index_prefixes(options: DanubeOptions) -> list[str]:
    """Namespace-index prefixes the query resolves its topics from."""
    if options.topics is not None:
        # A topic's own entry and its partitions' (`…/topics/ns/t-part-N`) share its key as prefix.
        return [keys.namespace_topic_key(TopicName.parse(t)) for t in options.topics]
    if options.namespace is not None:
        return [keys.namespace_topics_prefix(options.namespace)]
    return [keys.NAMESPACES_PREFIX]


def _is_broker_state(key: str) -> bool:
    return key.endswith("/state")


def _assigns_one_of(storage_paths: frozenset[str], key: str) -> bool:
    parsed = keys.parse_assignment_key(key)
    return parsed is not None and parsed[1].storage_path in storage_paths
