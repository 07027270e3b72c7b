"""What the topics pages show, read from the console's etcd cache and each partition's WAL
tail: namespaces, each topic's partitions, owner broker, objects and bytes in storage, newest
uploaded offset, head, and every subscription with its cursor and lag.

A subscription's lag is always its partition's head (the newest offset written, the WAL's
unuploaded tail included) minus its cursor, whoever consumes it: the `danube` data source's
record in the subscription record (`lag`: messages, bytes, ms, `updated_at`) is written only
while its query runs, so a stopped pipeline's record says what was true when it stopped. That
record is kept as detail beside the lag, with its age (`RecordedLag`). Offsets are inclusive,
as in etcd. Parsed descriptors are kept per (key, value) (`ParsedValues`), so a page over a
thousand topics parses only what changed since the last.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol

from danube_core import keys
from danube_core.errors import DanubeError
from danube_core.json_text import load_json
from danube_core.records import ObjectDescriptor, SealedState, parse_cursor
from danube_core.topics import TopicName

from console.wal_tail import WalTail

SUBSCRIPTION_TYPES = {0: "Exclusive", 1: "Shared", 2: "Failover"}

# The data source rewrites its lag record every 10 s while its query runs
# (`LAG_RECORD_INTERVAL_S` of `connectors.stream`); one missed write is a slow trigger, two a
# query that is not running.
RECORD_INTERVAL_S = 10.0
RECORD_STALE_AFTER_S = 2 * RECORD_INTERVAL_S

WalTails = Callable[["KeyReader", TopicName, "int | None"], WalTail]
"""(cache, partition, owner broker) -> that partition's WAL tail on its owner."""


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
class RecordedLag:
    """The `danube` data source's own measure, as it last wrote it (Unix seconds `updated_at`)."""

    messages: int | None
    bytes: int | None
    ms: int | None
    updated_at: int | None

    def age_s(self, now: float | None = None) -> float | None:
        return max(0.0, (time.time() if now is None else now) - self.updated_at) \
            if self.updated_at is not None else None

    def stale(self, now: float | None = None) -> bool:
        """Older than its writer's interval allows: its query is not running (or not reaching etcd)."""
        age = self.age_s(now)
        return age is None or age > RECORD_STALE_AFTER_S


@dataclass(frozen=True)
class SubscriptionRow:
    """One subscription of one partition: its cursor (inclusive: the last offset acknowledged)
    against the partition's `head`. `record`: the data source's lag record, None for others."""

    topic: str
    name: str
    kind: str | None
    consumer: str | None
    cursor: int | None
    head: int | None
    record: RecordedLag | None = None

    @property
    def lag_messages(self) -> int | None:
        """Messages written after the cursor; None without a cursor or a known head."""
        return max(0, self.head - self.cursor) if self.head is not None and self.cursor is not None else None


@dataclass(frozen=True)
class PartitionRow:
    topic: str
    partition: int | None
    owner: int | None
    objects: int
    object_bytes: int
    newest_uploaded: int | None  # inclusive end of the last object
    sealed_offset: int | None
    wal: WalTail
    subscriptions: list[SubscriptionRow] = field(default_factory=list)

    @property
    def head(self) -> int | None:
        """The newest offset written: the WAL's, uploaded, sealed, or acknowledged by a cursor."""
        return _newest(self.wal.last_offset, self.newest_uploaded, self.sealed_offset,
                       *(s.cursor for s in self.subscriptions))


def _newest(*offsets: int | None) -> int | None:
    seen = [o for o in offsets if o is not None]
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
    def head(self) -> int | None:
        """The newest head of its partitions (one partition's, for an unpartitioned topic)."""
        return _newest(*(p.head for p in self.partitions))

    @property
    def lag_messages(self) -> int | None:
        """Messages behind, summed over every subscription that has a cursor."""
        found = [s.lag_messages for s in self.subscriptions if s.lag_messages is not None]
        return sum(found) if found else None


class TopicsReader:
    """Builds the topics pages' rows from a cache and the partitions' WAL tails (`wal_tails`).
    One instance per console (its parse memo)."""

    def __init__(self, root_prefix: str, wal_tails: WalTails) -> None:
        self.storage = keys.StorageKeys(root_prefix)
        self._parsed = ParsedValues()
        self._wal_tails = wal_tails

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
        owner = owners.get(topic.storage_path)
        newest = descriptors[-1].end_offset if descriptors else None
        sealed_at = sealed.last_committed_offset if sealed is not None and sealed.sealed else None
        wal = self._wal_tails(cache, topic, owner)
        cursors, records = self._subscription_keys(cache, topic)
        head = _newest(wal.last_offset, newest, sealed_at, *cursors.values())
        subs = [self._subscription(str(topic), name, records.get(name), cursors.get(name), head)
                for name in sorted(set(records) | set(cursors))]
        return PartitionRow(str(topic), topic.partition, owner, len(descriptors), sum(d.size for d in descriptors),
                            newest, sealed_at, wal, subs)

    def descriptors(self, cache: KeyReader, topic: TopicName) -> list[ObjectDescriptor]:
        out = []
        for key, raw in cache.get_prefix(self.storage.objects_prefix(topic)):
            if keys.parse_object_key(key) is not None:
                out.append(self._parsed.get(key, raw, ObjectDescriptor.from_json))
        return out

    def _subscription_keys(self, cache: KeyReader, topic: TopicName) -> tuple[dict[str, int], dict[str, dict]]:
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
        return cursors, records

    @staticmethod
    def _subscription(topic: str, name: str, record: dict | None, cursor: int | None,
                      head: int | None) -> SubscriptionRow:
        record = record if isinstance(record, dict) else {}
        lag = record.get("lag") if isinstance(record.get("lag"), dict) else None
        kind = SUBSCRIPTION_TYPES.get(record.get("subscription_type", -1))
        recorded = RecordedLag(_int(lag.get("messages")), _int(lag.get("bytes")), _int(lag.get("ms")),
                               _int(lag.get("updated_at"))) if lag is not None else None
        return SubscriptionRow(topic, name, kind, record.get("consumer_name"), cursor, head, recorded)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def all_subscriptions(reader: TopicsReader, cache: KeyReader) -> Iterable[SubscriptionRow]:
    """Every subscription of every topic of the cluster (the lag history's sample)."""
    owners = reader.owners(cache)
    for namespace in reader.namespaces(cache):
        for topic in reader.topics(cache, namespace, owners):
            yield from topic.subscriptions
