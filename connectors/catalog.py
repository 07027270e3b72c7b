"""Driver-side lookups behind one small interface (as Spark Kafka's `KafkaOffsetReader`).

`TopicCatalog` answers the questions planning needs — which topics, which offsets, which
objects and WAL frames — from etcd, object metadata and WAL directories, and hands the answers
to the pure planner as `TopicSnapshot`s. Executors never use it.

* Descriptors are read by key range from the padded start key (spec §5.2), never by scanning a
  topic's whole history (`connectors.descriptor_reads`).
* The WAL chain comes from `connectors.wal_scan` (owner's directory first, previous owners'
  when needed; incremental header scans from the uploader's resume point).
* Which topics a query reads comes from the namespace index (`connectors.topic_resolver`).
* Where a topic ends (its latest offset, WAL chain, sealed state) is `connectors.topic_head`.
* Offset reuse: once per topic (and again whenever `cur` stops moving forward), every
  descriptor is read and the topic's objects are listed (`connectors.topic_audit`), and
  `connectors.topic_runs` sorts them, the WAL runs and the sealed state into the current run
  and stale ones. Snapshots hold only the current run's objects and the reused ranges, which
  the planner reports as data loss.
* A WAL that cannot be found (a real broker registers no `wal_url`) is named in one warning
  per topic and owner, with the unread tail as far as etcd tells (`TopicSnapshot.unread_tail`).
* What planning must report besides the objects comes with each snapshot: a new run that
  began since the catalog last looked (`restarted_at`) and that unread tail.

Offsets returned are end-exclusive (Spark's convention); etcd's stay inclusive. A catalog keeps
scan state between calls and is meant for one driver thread.
"""

from __future__ import annotations

import logging
from typing import Iterable

from connectors.descriptor_reads import DescriptorReader
from connectors.snapshot import StoredObject, TopicSnapshot
from connectors.topic_audit import TopicAuditor
from connectors.topic_head import TopicHead, TopicHeads
from connectors.topic_resolver import TopicResolver
from connectors.topic_runs import RunAudit
from connectors.unread_tail import UnreadTails
from connectors.options import WAL_AUTO, WAL_NONE
from connectors.wal_scan import ClusterView, WalFinder
from danube_core import keys
from danube_core.errors import MetadataError, ObjectMissingError
from danube_core.metadata import MetadataStore
from danube_core.objectstore import OBJECT_ID_PATTERN, ObjectStore, object_id_for
from danube_core.records import ObjectDescriptor, parse_cursor
from danube_core.topics import TopicName

__all__ = ["TopicCatalog", "WAL_AUTO", "WAL_NONE"]  # the walRoot keywords, for options

logger = logging.getLogger(__name__)


class TopicCatalog:
    """Everything the driver looks up about topics; see the module docstring."""

    def __init__(
        self,
        metadata: MetadataStore,
        *,
        root_prefix: str,
        storage_url: str,
        storage_options: dict,
        wal_root: str,
        fail_on_data_loss: bool,
    ) -> None:
        self._metadata = metadata
        self._keys = keys.StorageKeys(root_prefix)
        self._store = ObjectStore(storage_url, storage_options)
        self._store_url = storage_url
        self._storage_options = dict(storage_options)
        self._fail_on_data_loss = fail_on_data_loss
        self._wal = None if wal_root == WAL_NONE else WalFinder(wal_root, storage_url, storage_options)
        self._sizes: dict[str, int] = {}
        self._stored_memo: dict[tuple[str, str], tuple[ObjectDescriptor, StoredObject]] = {}  # see _stored
        self._descriptors = DescriptorReader(metadata, self._keys, on_memo_reset=self._stored_memo.clear)
        self._object_dirs: dict[TopicName, str] = {}
        self._topics = TopicResolver(metadata)
        self._audits: dict[str, RunAudit] = {}
        self._auditor = TopicAuditor(metadata, self._keys, self._store, self._storage_options, self._wal,
                                     self._descriptors, self._objects_url, self._audits)
        self._heads = TopicHeads(metadata, self._keys, self._descriptors, self._wal, UnreadTails(self._cursors),
                                 self._audits, self._auditor.audit)

    # ---- topics ---------------------------------------------------------------------------

    def resolve_topics(
        self, topics: list[str] | None = None, pattern: str | None = None, namespace: str | None = None
    ) -> list[TopicName]:
        """Topics to read: explicit names, a regex or a whole namespace (`TopicResolver.resolve`)."""
        return self._topics.resolve(topics, pattern, namespace)

    def indexed(self, topics: Iterable[TopicName | str]) -> set[str]:
        """Those of `topics` the namespace index lists now (a deleted topic's entry is gone)."""
        return self._topics.indexed(map(_topic, topics))

    def namespace_topics(self, namespace: str) -> list[TopicName]:
        """Every topic and partition the namespace index lists, in a stable order."""
        return self._topics.namespace_topics(namespace)

    # ---- offsets --------------------------------------------------------------------------

    def earliest_offsets(self, topics: Iterable[TopicName | str]) -> dict[str, int]:
        """First readable offset per topic: the current run's first object's start, else the
        WAL's first offset, else the latest offset (an empty topic)."""
        out = {}
        cluster = self._cluster()
        for topic in map(_topic, topics):
            latest = self._head(topic, cluster).latest  # audits the topic's runs once
            audit = self._audits[str(topic)]
            descriptors = self._descriptors.first(topic)
            if descriptors and descriptors[0].object_id in audit.stale_ids():
                descriptors = audit.current_descriptors[:1]
            if descriptors:
                out[str(topic)] = descriptors[0].start_offset
                continue
            snap = self._snapshot(topic, 0, 0, cluster)
            out[str(topic)] = snap.wal_start if snap.wal_start is not None else latest
        return out

    def latest_offsets(self, topics: Iterable[TopicName | str]) -> dict[str, int]:
        """Next offset not yet readable, per topic (end-exclusive)."""
        cluster = self._cluster()
        return {str(t): self._head(t, cluster).latest for t in map(_topic, topics)}

    def window_end(self, topic: TopicName | str, from_offset: int, latest: int, descriptors: int) -> int:
        """Where a plan from `from_offset` ends if it holds the object holding `from_offset` and
        at most `descriptors` objects starting after it: the start of the next descriptor when
        more lie below `latest`, else `latest`. One range read of at most `descriptors + 1`
        keys, so a stream far behind on a long history plans a window of it per trigger
        instead of the whole backlog."""
        name = _topic(topic)
        if from_offset >= latest:
            return latest
        start_key = self._keys.object_key(name, from_offset + 1)
        rows = self._metadata.get_range(start_key, self._keys.object_key(name, latest), limit=descriptors + 1)
        if len(rows) <= descriptors:
            return latest
        beyond = keys.parse_object_key(rows[-1][0])
        return latest if beyond is None else max(from_offset + 1, min(beyond, latest))

    def offsets_for_timestamp(
        self, topics: Iterable[TopicName | str], timestamp_ms: int
    ) -> dict[str, int]:
        """First offset whose publish_time >= `timestamp_ms`, else the latest offset."""
        from connectors.timestamps import offset_for_timestamp

        return {str(t): offset_for_timestamp(self.snapshot(t, 0), self._store, timestamp_ms,
                                             self._fail_on_data_loss) for t in map(_topic, topics)}

    def read_cursor(self, topic: TopicName | str, subscription: str) -> int | None:
        """The subscription's cursor (last acknowledged offset, inclusive), None if unset."""
        key = keys.cursor_key(_topic(topic), subscription)
        raw = self._metadata.get(key)
        return None if raw is None else parse_cursor(raw, key)

    def read_from(self, topic: TopicName | str, offset: int | None) -> None:
        """A stream reads `topic` from `offset` on (None: from its head, for `latest`), so its
        run audit need only cover the descriptors from the one holding that offset: a stream
        resuming near the head of a long history reads a few keys, not the history. An offset
        below the audit's start makes the next look at the topic audit again from there.

        An older run's descriptor stored below that key and reaching past it is not seen by
        such an audit; batch reads and the inspector audit the whole topic.
        """
        name = str(_topic(topic))
        if self._auditor.read_from(name, offset):
            self._audits.pop(name, None)
            self._heads.forget(name)

    # ---- snapshots ------------------------------------------------------------------------

    def snapshot(
        self, topic: TopicName | str, from_offset: int = 0, to_offset: int | None = None
    ) -> TopicSnapshot:
        """Objects overlapping `[from_offset, to_offset)` (to the head if None), the WAL chain
        and the latest offset of one topic."""
        return self._snapshot(_topic(topic), from_offset, to_offset, self._cluster())

    def snapshots(
        self, from_offsets: dict[str, int], to_offsets: dict[str, int] | None = None
    ) -> dict[str, TopicSnapshot]:
        """`snapshot` for many topics, reading the cluster's assignments only once."""
        cluster = self._cluster()
        to = to_offsets or {}
        return {t: self._snapshot(_topic(t), f, to.get(t), cluster) for t, f in from_offsets.items()}

    def read_frame_index(
        self, obj: StoredObject, byte_start: int, byte_end: int
    ) -> list[tuple[int, int]]:
        """(offset, header position) of every frame in bytes [byte_start, byte_end) of an object;
        `planner.cap_end_offsets(frame_index=...)` uses it for exact byte caps."""
        from danube_core.arrow_decode import scan_frame_offsets

        try:
            data = self._store.read_range(obj.url, byte_start, byte_end)
        except ObjectMissingError:
            logger.warning("object %s is missing; byte caps round down to its index entries", obj.url)
            return []
        offsets, positions, _consumed, _stop = scan_frame_offsets(data, byte_start)
        return list(zip(offsets.tolist(), positions.tolist()))

    def _snapshot(
        self, topic: TopicName, from_offset: int, to_offset: int | None, cluster: ClusterView | None
    ) -> TopicSnapshot:
        head = self._head(topic, cluster)
        last, sealed, wal, latest = head.last, head.sealed, head.wal, head.latest
        audit = self._audits.get(str(topic))
        objects: list[ObjectDescriptor] = []
        stop = latest if to_offset is None else to_offset
        if last is not None and from_offset < stop:
            if from_offset >= last.start_offset:
                objects = [last] if last.end_offset >= from_offset else []
                # The next snapshot, after an upload, starts its key range here (no search).
                self._descriptors.holding(topic, last)
            else:
                objects = self._descriptors.overlapping(topic, from_offset, stop, audit)
        return TopicSnapshot(
            topic=str(topic),
            objects=[self._stored(topic, d) for d in objects],
            wal=wal,
            latest_offset=latest,
            object_storage_options=self._storage_options,
            wal_storage_options=self._wal.options_for(wal[0].url) if self._wal and wal else {},
            sealed_offset=sealed.last_committed_offset if sealed else None,
            reused=audit.reused(0, latest) if audit is not None else [],
            restarted_at=head.restarted_at,
            unread_tail=head.unread_tail,
        )

    def _cluster(self) -> ClusterView | None:
        """Assignments and registrations, needed only when WAL dirs are per broker."""
        return ClusterView.read(self._metadata) if self._wal is not None and self._wal.per_broker else None

    def hold_heads(self) -> None:
        """Work out each topic's head at most once until the next call: a stream calls it once
        per trigger, so `latestOffset` and `partitions` plan from one view of each topic and
        its WAL is scanned once."""
        self._heads.hold()

    def _head(self, topic: TopicName, cluster: ClusterView | None) -> TopicHead:
        return self._heads.head(topic, cluster)

    # ---- runs and unread tails ------------------------------------------------------------

    def audit(self, topic: TopicName | str) -> RunAudit:
        """The topic's run audit (current run, stale sources, reused offsets), made now."""
        topic = _topic(topic)
        self._audits.pop(str(topic), None)
        self._heads.forget(str(topic))
        self._head(topic, self._cluster())
        return self._audits[str(topic)]

    def _cursors(self, topic: str) -> list[int]:
        found = []
        for key, raw in self._metadata.get_prefix(keys.subscriptions_prefix(_topic(topic))):
            if key.endswith("/cursor"):
                try:
                    found.append(parse_cursor(raw, key))
                except MetadataError:
                    continue
        return found

    # ---- descriptors and objects ---------------------------------------------------------

    def covering_start(self, topic: TopicName | str, offset: int) -> int:
        """Start key of the descriptor holding `offset`: `offset` itself or the nearest key below
        (a few 1-key range reads: `DescriptorReader.covering_start`)."""
        return self._descriptors.covering_start(_topic(topic), offset)

    def _stored(self, topic: TopicName, d: ObjectDescriptor) -> StoredObject:
        """The object `d` describes, built once per parsed descriptor: a trigger plans the same
        objects twice (`latestOffset`, then `partitions`)."""
        memo_key = (str(topic), d.object_id)
        known = self._stored_memo.get(memo_key)
        if known is not None and known[0] is d:
            return known[1]
        stored = self._build_stored(topic, d)
        self._stored_memo[memo_key] = (d, stored)
        return stored

    def _build_stored(self, topic: TopicName, d: ObjectDescriptor) -> StoredObject:
        if not OBJECT_ID_PATTERN.match(d.object_id):
            raise MetadataError(f"descriptor {self._keys.object_key(topic, d.start_offset)} names a "
                                f"malformed object id {d.object_id!r} (expected data-<start>-<secs>.dnb1)")
        url = self._objects_url(topic) + d.object_id
        size = d.size
        if size <= max((pos for _, pos in d.offset_index or ()), default=0):
            size = self._object_size(url, size)  # the writer's size is unreliable (spec §9.3)
        return StoredObject.build(d.object_id, url, d.start_offset, d.end_offset, size, d.created_at,
                                  d.offset_index)

    def storage_options_for(self, url: str) -> dict:
        """fsspec options for an object or WAL URL (storage options apply to their protocol)."""
        if self._wal is not None:
            return self._wal.options_for(url)
        return WalFinder(WAL_AUTO, self._store_url, self._storage_options).options_for(url)

    def objects_url(self, topic: TopicName) -> str:
        """URL of the topic's objects directory, with a trailing slash."""
        return self._objects_url(topic)

    def _objects_url(self, topic: TopicName) -> str:
        """URL of the topic's objects directory, with a trailing slash (computed once)."""
        if topic not in self._object_dirs:
            probe = object_id_for(0, 0)
            self._object_dirs[topic] = self._store.object_url(topic, probe)[: -len(probe)]
        return self._object_dirs[topic]

    def _object_size(self, url: str, fallback: int) -> int:
        if url not in self._sizes:
            try:
                self._sizes[url] = self._store.size(url)
            except ObjectMissingError:
                return fallback  # the executor reading it reports the loss
        return self._sizes[url]


def _topic(topic: TopicName | str) -> TopicName:
    return topic if isinstance(topic, TopicName) else TopicName.parse(topic)
