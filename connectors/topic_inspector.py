"""What a person exploring topics wants to see: partitions, storage, sealed state, subscriptions, lag.

The notebooks (and anyone at a Python prompt) look at a cluster through the same options the
`danube` source takes, so one dict of options serves `spark.read.format("danube")` and this
inspector alike. It answers in small frozen records whose `as_row()` is a plain dict ready
for `spark.createDataFrame` or pandas; u64 broker ids are given as decimal text there, since
Spark's `long` cannot hold ids above 2^63.

Offsets follow the connector's convention: `latest_offset` and `next_offset` are end-exclusive
positions; `cursor` and descriptor ends are inclusive as in etcd (spec §6.4). Lag is what the
streaming source reports for its own subscription (`connectors.lag.measure_lag`): messages
after the cursor, the bytes a reader would fetch for them, and the publish-time distance
between the newest message and the last acknowledged one.

Unlike planning, listing a topic's descriptors reads them all (bounded by `limit`): this is
for looking at a topic, not for reading it.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from connectors.batch import open_catalog, topics_of
from connectors.catalog import TopicCatalog
from connectors.options import DanubeOptions, parse_options
from connectors.lag import measure_lag
from danube_core import keys
from danube_core.etcd_settings import EtcdSettings
from danube_core.metadata import MetadataStore
from danube_core.records import ObjectDescriptor, SealedState, SubscriptionRecord, parse_cursor, parse_delivery
from danube_core.topics import TopicName

logger = logging.getLogger(__name__)

DEFAULT_DESCRIPTOR_LIMIT = 10_000
# A snapshot taken from beyond every offset reads no descriptors: only the WAL and the head.
_PAST_EVERY_OFFSET = 2**64
SUBSCRIPTION_TYPES = {0: "Exclusive", 1: "Shared", 2: "Failover"}


_DDL_TYPES = {"int": "long", "str": "string", "bool": "boolean"}


class _Row:
    """`as_row()`: the record as a dict of plain values (u64 ids as decimal text); `ddl()`:
    the matching Spark schema, so a list whose column is None in every row still has a type."""

    _ID_FIELDS: tuple[str, ...] = ()

    def as_row(self) -> dict[str, Any]:
        row = dataclasses.asdict(self)  # type: ignore[call-overload]
        for name in self._ID_FIELDS:
            if row[name] is not None:
                row[name] = str(row[name])
        return row

    @classmethod
    def ddl(cls) -> str:
        """`"topic string, partition long, ..."` for `spark.createDataFrame(rows, cls.ddl())`."""
        columns = []
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            base = str(f.type).replace(" | None", "").strip()
            kind = "string" if f.name in cls._ID_FIELDS else _DDL_TYPES[base]
            columns.append(f"{f.name} {kind}")
        return ", ".join(columns)


@dataclass(frozen=True)
class TopicOverview(_Row):
    """One topic partition: where its messages are and how far they go."""

    _ID_FIELDS = ("owner_broker",)

    topic: str
    base_name: str
    partition: int | None
    delivery: str | None  # "Reliable" | "NonReliable" | None when the key is missing
    owner_broker: int | None  # assigned broker id; None while unassigned (sealed, moving)
    earliest_offset: int
    latest_offset: int  # end-exclusive: the next offset not yet readable
    objects: int
    object_bytes: int
    first_object_offset: int | None
    last_object_offset: int | None  # inclusive
    wal_start: int | None  # first offset served from the WAL: the tail past the objects (None: none)
    sealed: bool
    sealed_offset: int | None  # the sealed state's last_committed_offset (inclusive)
    subscriptions: int


@dataclass(frozen=True)
class DescriptorRow(_Row):
    """One object descriptor (spec §5.2) with its key."""

    topic: str
    key: str
    object_id: str
    start_offset: int
    end_offset: int  # inclusive
    messages: int
    size: int
    etag: str | None
    created_at: int  # Unix seconds
    index_entries: int

    @classmethod
    def of(cls, topic: str, key: str, d: ObjectDescriptor) -> "DescriptorRow":
        return cls(topic, key, d.object_id, d.start_offset, d.end_offset, d.end_offset - d.start_offset + 1,
                   d.size, d.etag, d.created_at, len(d.offset_index or ()))


@dataclass(frozen=True)
class SealedRow(_Row):
    """A topic's sealed-state marker (present between an unload and the next load, §6.2)."""

    _ID_FIELDS = ("broker_id",)

    topic: str
    sealed: bool
    last_committed_offset: int
    broker_id: int
    timestamp: int  # Unix seconds


@dataclass(frozen=True)
class SubscriptionLag(_Row):
    """How far one subscription of one topic partition is behind.

    A subscription without a cursor starts at the latest offset when it attaches, so it has
    no backlog to measure: `next_offset` and the lag fields are None. `bytes` or `ms` is None
    when the backlog cannot be read (lost data is reported when it is read).
    """

    topic: str
    subscription: str
    subscription_type: str | None
    consumer_name: str | None
    cursor: int | None  # last acknowledged offset, inclusive
    next_offset: int | None  # cursor + 1
    latest_offset: int  # end-exclusive
    messages: int | None
    bytes: int | None
    ms: int | None


@dataclass(frozen=True)
class RunRow(_Row):
    """One source of a topic's messages and the run it belongs to (`connectors.topic_runs`).

    `run` is `current` (what reads return) or `older` (offsets a newer run reused, or will
    reuse: read it with the batch option `salvage=<source>`). Offsets inclusive.
    """

    topic: str
    run: str
    kind: str  # object | wal | sealed-state
    source: str  # object id or WAL file URL: what `salvage` takes
    first_offset: int
    last_offset: int
    referenced: bool  # a descriptor points at it
    created_at: int | None  # upload time of an object (seconds)
    first_publish_ms: int | None
    last_publish_ms: int | None
    note: str


class TopicInspector:
    """Read-only views of topics, built from the `danube` source options."""

    def __init__(self, options: DanubeOptions, catalog: TopicCatalog, metadata: MetadataStore) -> None:
        self.options = options
        self.catalog = catalog
        self.metadata = metadata
        self._keys = keys.StorageKeys(options.root_prefix)

    @classmethod
    def from_options(cls, options: Mapping[str, str], etcd: EtcdSettings | None = None) -> "TopicInspector":
        """Connect with the same options as `spark.read.format("danube")` (topic/namespace/pattern
        select what `topics()` lists); ConfigError names a bad option. `etcd`: settings given
        instead of the `etcd.*` options (a command's `--etcd` flags)."""
        parsed = parse_options(options, etcd=etcd)
        catalog, metadata = open_catalog(parsed)
        return cls(parsed, catalog, metadata)

    def close(self) -> None:
        self.metadata.close()

    def __enter__(self) -> "TopicInspector":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- topics -------------------------------------------------------------------------

    def topics(self) -> list[str]:
        """The topic partitions the options select, as broker names (partitions expanded)."""
        return topics_of(self.catalog, self.options)

    def partitions(self, topic: str) -> list[str]:
        """`[topic]`, or the `-part-N` partitions of a partitioned topic's base name."""
        return [str(t) for t in self.catalog.resolve_topics(topics=[topic])]

    def overview(self, topics: Iterable[str] | None = None) -> list[TopicOverview]:
        """One `TopicOverview` per topic partition (default: `topics()`)."""
        names = list(self.topics() if topics is None else topics)
        owners = self._owners()
        return [self._overview(TopicName.parse(name), owners) for name in names]

    def _overview(self, topic: TopicName, owners: Mapping[str, int]) -> TopicOverview:
        name = str(topic)
        head = self.catalog.snapshot(topic, from_offset=_PAST_EVERY_OFFSET)
        descriptors = self.descriptors(name, limit=None)  # counts and bytes cover the whole history
        sealed = self.sealed_state(name)
        return TopicOverview(
            topic=name,
            base_name=topic.base_name,
            partition=topic.partition,
            delivery=self._delivery(topic),
            owner_broker=owners.get(topic.storage_path),
            earliest_offset=self.catalog.earliest_offsets([name])[name],
            latest_offset=head.latest_offset,
            objects=len(descriptors),
            object_bytes=sum(d.size for d in descriptors),
            first_object_offset=descriptors[0].start_offset if descriptors else None,
            last_object_offset=descriptors[-1].end_offset if descriptors else None,
            wal_start=head.wal_start,
            sealed=bool(sealed and sealed.sealed),
            sealed_offset=sealed.last_committed_offset if sealed else None,
            subscriptions=len(self.subscriptions(name)),
        )

    def _owners(self) -> dict[str, int]:
        owners = {}
        for key, _ in self.metadata.get_prefix(keys.BROKERS_PREFIX, keys_only=True):
            parsed = keys.parse_assignment_key(key)
            if parsed is not None:
                owners[parsed[1].storage_path] = parsed[0]
        return owners

    def _delivery(self, topic: TopicName) -> str | None:
        key = keys.delivery_key(topic)
        raw = self.metadata.get(key)
        return None if raw is None else parse_delivery(raw, key)

    # ---- storage ------------------------------------------------------------------------

    def descriptors(
        self, topic: str, from_offset: int = 0, limit: int | None = DEFAULT_DESCRIPTOR_LIMIT
    ) -> list[DescriptorRow]:
        """Descriptors from the one starting at `from_offset` on, at most `limit` (None: all), by start offset."""
        t = TopicName.parse(topic)
        found = self.metadata.get_range(self._keys.object_key(t, from_offset), self._keys.cur_key(t), limit=limit)
        out = []
        for key, raw in found:
            if keys.parse_object_key(key) is not None:
                out.append(DescriptorRow.of(str(t), key, ObjectDescriptor.from_json(raw, key)))
        if limit is not None and len(found) == limit:
            logger.info("listed the first %d descriptors of %s from offset %d; raise `limit` for more",
                        limit, t, from_offset)
        return out

    def sealed_state(self, topic: str) -> SealedRow | None:
        """The sealed-state marker, or None when the topic is loaded (no marker)."""
        t = TopicName.parse(topic)
        key = self._keys.state_key(t)
        raw = self.metadata.get(key)
        if raw is None:
            return None
        state = SealedState.from_json(raw, key)
        return SealedRow(str(t), state.sealed, state.last_committed_offset, state.broker_id, state.timestamp)

    def runs(self, topic: str) -> list[RunRow]:
        """Every object and WAL run of the topic, sorted into its current run and older ones.

        Older sources are read whole to give their publish-time range (this is for deciding
        what to salvage, not for planning).
        """
        audit = self.catalog.audit(topic)
        snap = self.catalog.snapshot(topic, 0)
        rows = [RunRow(topic, "current", "object", o.object_id, o.start_offset, o.end_offset, True,
                       o.created_at, None, None, "") for o in snap.objects]
        rows += [RunRow(topic, "current", "wal", w.url, w.first_offset, w.stop_offset - 1, False,
                        None, None, None, "not uploaded yet") for w in snap.wal if w.stop_offset > w.first_offset]
        for src in audit.stale_sources:
            first_ms, last_ms = self._publish_range(topic, src.name) if src.url else (None, None)
            rows.append(RunRow(topic, "older", src.kind, src.name, src.first_offset, src.last_offset,
                               src.referenced, src.created_at, first_ms, last_ms, src.note))
        return rows

    def _publish_range(self, topic: str, source: str) -> tuple[int | None, int | None]:
        from connectors.salvage import salvage_tasks
        from connectors.task_reader import read_task

        times = [int(t) for task in salvage_tasks(self.catalog, topic, [source], fail_on_data_loss=False)
                 for batch in read_task(task, ["publish_time"]) for t in batch.column(0).to_numpy()]
        return (min(times), max(times)) if times else (None, None)

    def unread_tail(self, topic: str) -> dict | None:
        """The tail a WAL this inspector cannot read holds (owner, from offset, evidence), or None."""
        return self.catalog.snapshot(topic, 0, 0).unread_tail

    # ---- subscriptions ------------------------------------------------------------------

    def subscriptions(self, topic: str) -> dict[str, tuple[SubscriptionRecord | None, int | None]]:
        """`{name: (record, cursor)}` from `/topics{T}/subscriptions/`; either may be missing."""
        t = TopicName.parse(topic)
        found: dict[str, tuple[SubscriptionRecord | None, int | None]] = {}
        for key, raw in self.metadata.get_prefix(keys.subscriptions_prefix(t)):
            name, is_cursor = keys.parse_subscription_key(t, key)
            record, cursor = found.get(name, (None, None))
            if is_cursor:
                cursor = parse_cursor(raw, key)
            else:
                record = SubscriptionRecord.from_json(raw, key)
            found[name] = (record, cursor)
        return dict(sorted(found.items()))

    def lag(self, topics: Iterable[str] | None = None, subscription: str | None = None) -> list[SubscriptionLag]:
        """Lag of every subscription of each topic partition, or only of `subscription`."""
        out = []
        for name in (self.topics() if topics is None else topics):
            subs = self.subscriptions(name)
            if subscription is not None:
                subs = {subscription: subs.get(subscription, (None, None))}
            latest = self.catalog.latest_offsets([name])[name]
            for sub, (record, cursor) in subs.items():
                out.append(self._lag(name, sub, record, cursor, latest))
        return out

    def _lag(self, topic: str, subscription: str, record: SubscriptionRecord | None,
             cursor: int | None, latest: int) -> SubscriptionLag:
        kind = SUBSCRIPTION_TYPES.get(record.subscription_type) if record is not None else None
        consumer = record.consumer_name if record is not None else None
        if cursor is None:
            return SubscriptionLag(topic, subscription, kind, consumer, None, None, latest, None, None, None)
        begin = min(cursor + 1, latest)
        snapshots = self.catalog.snapshots({topic: max(0, begin - 1)}, {topic: latest})
        measured = measure_lag({topic: begin}, {topic: latest}, snapshots)[topic]
        return SubscriptionLag(topic, subscription, kind, consumer, cursor, cursor + 1, latest,
                               measured["messages"], measured.get("bytes"), measured.get("ms"))


def rows(records: Iterable[_Row]) -> list[dict[str, Any]]:
    """`as_row()` of each record, for `spark.createDataFrame(rows(...))` or pandas."""
    return [r.as_row() for r in records]
