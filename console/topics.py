"""What the topics pages show, read from the console's etcd cache: namespaces, each topic's
partitions, owner broker, objects and bytes in storage, newest uploaded offset, and every
subscription with its cursor and lag.

Lag is what the `danube` data source records in its subscription record (`lag`: messages,
bytes, ms, `updated_at`, written by `connectors.cursor_commit.record_lag`); a subscription
without one (a broker consumer's) gets its lag in messages from the cursor and the newest
offset known. Offsets are inclusive, as in etcd. Parsed descriptors are kept per (key, value)
(`ParsedValues`), so a page over a thousand topics parses only what changed since the last.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol

from danube_core import keys
from danube_core.errors import DanubeError
from danube_core.json_text import load_json
from danube_core.records import ObjectDescriptor, SealedState, parse_cursor
from danube_core.topics import TopicName

SUBSCRIPTION_TYPES = {0: "Exclusive", 1: "Shared", 2: "Failover"}


class KeyReader(Protocol):
    """The read half of a metadata store (a `LocalCache`)."""

    def get(self, key: str) -> bytes | None: ...

    def get_prefix(self, prefix: str, keys_only: bool = False) -> list[tuple[str, bytes]]: ...


class ParsedValues:
    """Values parsed once per (key, raw bytes): a cache hands back the same bytes until a key changes."""

    def __init__(self, limit: int = 200_000) -> None:
        self._parsed: dict[str, tuple[bytes, Any]] = {}
        self._limit = limit

    def get(self, key: str, raw: bytes, parse: Callable[[bytes, str], Any]) -> Any:
        held = self._parsed.get(key)
        if held is not None and held[0] is raw:
            return held[1]
        value = parse(raw, key)
        if len(self._parsed) >= self._limit:
            self._parsed.clear()
        self._parsed[key] = (raw, value)
        return value


@dataclass(frozen=True)
class SubscriptionRow:
    """One subscription of one partition. `lag_*` None: not recorded and not computable."""

    topic: str
    name: str
    kind: str | None
    consumer: str | None
    cursor: int | None
    lag_messages: int | None
    lag_bytes: int | None
    lag_ms: int | None
    lag_recorded_at: int | None  # Unix seconds of the data source's record; None: computed here


@dataclass(frozen=True)
class PartitionRow:
    topic: str
    partition: int | None
    owner: int | None
    objects: int
    object_bytes: int
    newest_uploaded: int | None  # inclusive end of the last object
    sealed_offset: int | None
    subscriptions: list[SubscriptionRow] = field(default_factory=list)

    @property
    def newest_known(self) -> int | None:
        """The newest offset etcd shows: uploaded, sealed, or acknowledged by a cursor."""
        seen = [o for o in (self.newest_uploaded, self.sealed_offset,
                            *(s.cursor for s in self.subscriptions)) if o is not None]
        return max(seen) if seen else None


@dataclass(frozen=True)
class TopicRow:
    """A topic as users name it: a partitioned topic's base name with its partitions."""

    name: str
    namespace: str
    partitions: list[PartitionRow]

    @property
    def objects(self) -> int:
        return sum(p.objects for p in self.partitions)

    @property
    def object_bytes(self) -> int:
        return sum(p.object_bytes for p in self.partitions)

    @property
    def subscriptions(self) -> list[SubscriptionRow]:
        return [s for p in self.partitions for s in p.subscriptions]

    @property
    def newest_uploaded(self) -> int | None:
        found = [p.newest_uploaded for p in self.partitions if p.newest_uploaded is not None]
        return max(found) if found else None

    @property
    def owners(self) -> list[int]:
        return sorted({p.owner for p in self.partitions if p.owner is not None})

    @property
    def lag_messages(self) -> int | None:
        """Messages behind, summed over every subscription that has a figure."""
        found = [s.lag_messages for s in self.subscriptions if s.lag_messages is not None]
        return sum(found) if found else None


class TopicsReader:
    """Builds the topics pages' rows from a cache. One instance per console (its parse memo)."""

    def __init__(self, root_prefix: str) -> None:
        self.storage = keys.StorageKeys(root_prefix)
        self._parsed = ParsedValues()

    def namespaces(self, cache: KeyReader) -> list[str]:
        found = {key[len(keys.NAMESPACES_PREFIX):].split("/", 1)[0]
                 for key, _ in cache.get_prefix(keys.NAMESPACES_PREFIX, keys_only=True)}
        return sorted(n for n in found if n)

    def owners(self, cache: KeyReader) -> dict[str, int]:
        """storage path (`ns/topic`) -> the broker it is assigned to."""
        owners = {}
        for key, _ in cache.get_prefix(keys.BROKERS_PREFIX, keys_only=True):
            parsed = keys.parse_assignment_key(key)
            if parsed is not None:
                owners[parsed[1].storage_path] = parsed[0]
        return owners

    def topics(self, cache: KeyReader, namespace: str, owners: dict[str, int] | None = None) -> list[TopicRow]:
        """Every topic of `namespace` (from its topic index), partitions grouped under the base name."""
        owners = self.owners(cache) if owners is None else owners
        return [self._row(cache, base, namespace, parts, owners)
                for base, parts in sorted(self._partitions_by_topic(cache, namespace).items())]

    def topic(self, cache: KeyReader, name: str) -> TopicRow | None:
        """One topic by its base name (or a partition's name), None when etcd has no such topic.
        Only its own partitions are read (the namespace's index is listed keys only)."""
        topic = TopicName.parse(name)
        parts = self._partitions_by_topic(cache, topic.namespace).get(topic.base_name)
        return self._row(cache, topic.base_name, topic.namespace, parts, self.owners(cache)) if parts else None

    def _partitions_by_topic(self, cache: KeyReader, namespace: str) -> dict[str, list[TopicName]]:
        grouped: dict[str, list[TopicName]] = {}
        for key, _ in cache.get_prefix(keys.namespace_topics_prefix(namespace), keys_only=True):
            try:
                name = keys.topic_from_namespace_index_key(key)
            except DanubeError:
                continue
            grouped.setdefault(name.base_name, []).append(name)
        return grouped

    def _row(self, cache: KeyReader, base: str, namespace: str, parts: list[TopicName],
             owners: dict[str, int]) -> TopicRow:
        return TopicRow(base, namespace, [self.partition(cache, p, owners)
                                          for p in sorted(parts, key=lambda t: t.partition or 0)])

    def partition(self, cache: KeyReader, topic: TopicName, owners: dict[str, int]) -> PartitionRow:
        descriptors = self.descriptors(cache, topic)
        raw_state = cache.get(self.storage.state_key(topic))
        sealed = (self._parsed.get(self.storage.state_key(topic), raw_state, SealedState.from_json)
                  if raw_state is not None else None)
        newest = descriptors[-1].end_offset if descriptors else None
        subs = self.subscriptions(cache, topic, newest)
        return PartitionRow(str(topic), topic.partition, owners.get(topic.storage_path), len(descriptors),
                            sum(d.size for d in descriptors), newest,
                            sealed.last_committed_offset if sealed is not None and sealed.sealed else None, subs)

    def descriptors(self, cache: KeyReader, topic: TopicName) -> list[ObjectDescriptor]:
        out = []
        for key, raw in cache.get_prefix(self.storage.objects_prefix(topic)):
            if keys.parse_object_key(key) is not None:
                out.append(self._parsed.get(key, raw, ObjectDescriptor.from_json))
        return out

    def subscriptions(self, cache: KeyReader, topic: TopicName, newest: int | None) -> list[SubscriptionRow]:
        records: dict[str, dict] = {}
        cursors: dict[str, int] = {}
        for key, raw in cache.get_prefix(keys.subscriptions_prefix(topic)):
            try:
                name, is_cursor = keys.parse_subscription_key(topic, key)
                if is_cursor:
                    cursors[name] = self._parsed.get(key, raw, parse_cursor)
                else:
                    records[name] = self._parsed.get(key, raw, load_json)
            except DanubeError:
                continue  # a value no broker wrote: shown as absent, not as an error page
        return [self._subscription(str(topic), name, records.get(name), cursors.get(name), newest)
                for name in sorted(set(records) | set(cursors))]

    @staticmethod
    def _subscription(topic: str, name: str, record: dict | None, cursor: int | None,
                      newest: int | None) -> SubscriptionRow:
        record = record if isinstance(record, dict) else {}
        lag = record.get("lag") if isinstance(record.get("lag"), dict) else None
        kind = SUBSCRIPTION_TYPES.get(record.get("subscription_type", -1))
        if lag is not None:
            return SubscriptionRow(topic, name, kind, record.get("consumer_name"), cursor, _int(lag.get("messages")),
                                   _int(lag.get("bytes")), _int(lag.get("ms")), _int(lag.get("updated_at")))
        computed = max(0, newest - cursor) if newest is not None and cursor is not None else None
        return SubscriptionRow(topic, name, kind, record.get("consumer_name"), cursor, computed, None, None, None)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def all_subscriptions(reader: TopicsReader, cache: KeyReader) -> Iterable[SubscriptionRow]:
    """Every subscription of every topic of the cluster (the lag history's sample)."""
    owners = reader.owners(cache)
    for namespace in reader.namespaces(cache):
        for topic in reader.topics(cache, namespace, owners):
            yield from topic.subscriptions
