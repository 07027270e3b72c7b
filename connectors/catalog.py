"""Driver-side lookups behind one small interface (as Spark Kafka's `KafkaOffsetReader`).

`TopicCatalog` answers the questions planning needs — which topics, which offsets, which
objects and WAL frames — from etcd, object metadata and WAL directories, and hands the answers
to the pure planner as `TopicSnapshot`s. Executors never use it.

* Descriptors are read by key range from the padded start key (spec §5.2), never by scanning a
  topic's whole history (`connectors.descriptor_reads`).
* The WAL chain comes from `connectors.wal_scan` (owner's directory first, previous owners'
  when needed; incremental header scans from the uploader's resume point).
* Where a topic ends (its latest offset, WAL chain, sealed state) is `connectors.topic_head`.
* Offset reuse: once per topic (and again whenever `cur` stops moving forward), every
  descriptor is read and the topic's objects are listed, and `connectors.topic_runs` sorts
  them, the WAL runs and the sealed state into the current run and stale ones. Snapshots hold
  only the current run's objects and the reused ranges, which the planner reports as data loss.
* A WAL that cannot be found (a real broker registers no `wal_url`) is named in one warning
  per topic and owner, with the unread tail as far as etcd tells (`TopicSnapshot.unread_tail`).
* What planning must report besides the objects comes with each snapshot: a new run that
  began since the catalog last looked (`restarted_at`) and that unread tail.

Offsets returned are end-exclusive (Spark's convention); etcd's stay inclusive. A catalog keeps
scan state between calls and is meant for one driver thread.
"""

from __future__ import annotations

import logging
import re
from typing import Iterable, Iterator

from connectors.descriptor_reads import DescriptorReader
from connectors.snapshot import StoredObject, TopicSnapshot, WalRun
from connectors.topic_head import TopicHead, TopicHeads
from connectors.topic_runs import ContiguousRun, RunAudit, audit_contiguous_run, audit_runs, current_chain
from connectors.unread_tail import UnreadTails
from connectors.options import WAL_AUTO, WAL_NONE
from connectors.wal_scan import ClusterView, WalFinder, scan_file_runs
from danube_core import keys
from danube_core.errors import MetadataError, ObjectMissingError
from danube_core.metadata import MetadataStore
from danube_core.objectstore import OBJECT_ID_PATTERN, ObjectStore, object_id_for, parse_object_id
from danube_core.records import CurPointer, ObjectDescriptor, SealedState, parse_cursor
from danube_core.topics import TopicName

__all__ = ["TopicCatalog", "WAL_AUTO", "WAL_NONE"]  # the walRoot keywords, for options

logger = logging.getLogger(__name__)

AUDIT_PAGE_KEYS = 1024  # descriptors a run audit reads and parses at a time (about 1 MB parsed)
LISTING_MARGIN = 1024  # offsets past the head a run audit lists objects to (`_listing_bound`)


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
        self._audits: dict[str, RunAudit] = {}
        self._object_ranges: dict[str, int] = {}  # orphan object URL -> its last offset
        self._heads = TopicHeads(metadata, self._keys, self._descriptors, self._wal, UnreadTails(self._cursors),
                                 self._audits, self._audit)
        # topic -> the lowest offset a stream reads it from (None: from its head); a topic not
        # here is read from anywhere (batch reads), so its run audit covers its whole history.
        self._read_from: dict[str, int | None] = {}
        self._audited_from: dict[str, int] = {}  # topic -> descriptor key its run audit starts at

    # ---- topics ---------------------------------------------------------------------------

    def resolve_topics(
        self, topics: list[str] | None = None, pattern: str | None = None, namespace: str | None = None
    ) -> list[TopicName]:
        """Topics to read: explicit names, a regex (full match on `/ns/topic` or its base name),
        or a whole namespace. A partitioned base name expands to its `-part-N` partitions
        (exact match on the base, unlike the broker's prefix match, §7). An explicit name that
        is not (yet) in the namespace index is kept, so it is read once it exists."""
        chosen = (topics is not None) + (pattern is not None) + (namespace is not None and pattern is None)
        if chosen != 1:
            raise ValueError("give exactly one of topics, pattern or namespace (pattern may be "
                             f"combined with namespace); got topics={topics!r} pattern={pattern!r} "
                             f"namespace={namespace!r}")
        if topics is not None:
            return sorted({p for name in topics for p in self._expand(TopicName.parse(name))}, key=_order)
        known = self._indexed(namespace)
        if pattern is None:
            return sorted(known, key=_order)
        regex = re.compile(pattern)
        matching = (t for t in known if regex.fullmatch(str(t)) or regex.fullmatch(t.base_name))
        return sorted(matching, key=_order)

    def indexed(self, topics: Iterable[TopicName | str]) -> set[str]:
        """Those of `topics` the namespace index lists now (a deleted topic's entry is gone)."""
        return {str(t) for t in map(_topic, topics) if self._metadata.get(keys.namespace_topic_key(t)) is not None}

    def namespace_topics(self, namespace: str) -> list[TopicName]:
        """Every topic and partition the namespace index lists, in a stable order."""
        return sorted(self._indexed(namespace), key=_order)

    def _indexed(self, namespace: str | None, prefix: str | None = None) -> list[TopicName]:
        """Topics in the namespace index: one namespace's, every namespace's, or those whose
        index key starts with `prefix`."""
        if prefix is None:
            prefix = keys.namespace_topics_prefix(namespace) if namespace else keys.NAMESPACES_PREFIX
        found = []
        for key, _ in self._metadata.get_prefix(prefix, keys_only=True):
            if "/topics/" in key:
                found.append(keys.topic_from_namespace_index_key(key))
        return found

    def _expand(self, topic: TopicName) -> list[TopicName]:
        # Only the index keys starting with the topic's own: itself and its `-part-N` partitions.
        known = self._indexed(topic.namespace, keys.namespace_topic_key(topic))
        if topic in known:
            return [topic]
        parts = [t for t in known if t.partition is not None and t.base_name == topic.broker_name]
        if not parts:
            logger.debug("topic %s is not in the namespace index (yet); reading it as it appears", topic)
            return [topic]
        return parts

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
        if name in self._read_from:
            known = self._read_from[name]
            if offset is None or (known is not None and known <= offset):
                return
        self._read_from[name] = offset
        audited = self._audited_from.get(name)
        if audited is not None and offset is not None and offset < audited:
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

    def _audit(self, topic: TopicName, sealed: SealedState | None, wal: list[WalRun]) -> RunAudit:
        """Read the descriptors (from `_audit_start` on) and list the objects once, and sort
        them into runs: a clean run folded page by page (`ContiguousRun`), anything else from
        the whole list."""
        raw_cur = self._metadata.get(self._keys.cur_key(topic))
        cur = int(CurPointer.from_json(raw_cur, self._keys.cur_key(topic)).start) if raw_cur else None
        floor = self._audit_start(topic, cur)
        wal_stop = wal[-1].stop_offset if wal else None
        listed_ids = self._store.list_objects(topic, floor, self._listing_bound(floor, cur, wal_stop))
        stale_wal = self._wal.stale_runs.get(str(topic), []) if self._wal is not None else []
        run = ContiguousRun(listed_ids)
        audit: RunAudit | None = None
        for page in self._descriptor_pages(topic, floor):
            if not run.take(page):
                break
        if run.clean and run.stop is not None and (wal_stop is None or wal_stop >= run.stop):
            newest = run.newest[-1].created_at
            unreferenced = [(oid, start, self._unless_in_flight(topic, oid, start, run.stop, newest))
                            for oid, start in run.unreferenced()]
            audit = audit_contiguous_run(str(topic), run, self._objects_url(topic), unreferenced, wal,
                                         stale_wal, sealed)
        if audit is None or not audit.clean:  # an unclean run's reads are planned from all of it
            audit = self._audit_whole(topic, floor, cur, listed_ids, sealed, wal, stale_wal)
        self._audits[str(topic)] = audit
        self._audited_from[str(topic)] = floor
        if not audit.clean:
            logger.warning("topic %s: %s", topic, audit.summary())
        audit.compact()
        return audit

    def _audit_whole(self, topic: TopicName, floor: int, cur: int | None, listed_ids: list[str],
                     sealed: SealedState | None, wal: list[WalRun], stale_wal: list[WalRun]) -> RunAudit:
        """The audit of a topic whose stored runs are not one clean run: every descriptor from
        `floor` on in memory at once (`current_chain` compares each with all)."""
        descriptors = [d for page in self._descriptor_pages(topic, floor) for d in page]
        chain, _ = current_chain(descriptors, cur)
        referenced = {d.object_id for d in descriptors}
        uploaded_stop = chain[-1].end_offset + 1 if chain else 0
        newest = max((d.created_at for d in chain), default=0)
        listed = []
        for oid in listed_ids:
            start = parse_object_id(oid)[0]
            listed.append((oid, start, None if oid in referenced
                           else self._unless_in_flight(topic, oid, start, uploaded_stop, newest)))
        return audit_runs(str(topic), descriptors, cur, self._objects_url(topic), listed, wal, stale_wal, sealed)

    def _unless_in_flight(self, topic: TopicName, object_id: str, start: int, uploaded_stop: int,
                          newest: int) -> int | None:
        """Last offset of an object no descriptor references, or None for an upload in flight
        (at or above the uploaded head and no older than the newest upload: its descriptor is
        not written yet), which is not scanned."""
        if start >= uploaded_stop and parse_object_id(object_id)[1] >= newest:
            return None
        return self._last_offset_of(self._objects_url(topic) + object_id, start)

    def _descriptor_pages(self, topic: TopicName, floor: int) -> Iterator[list[ObjectDescriptor]]:
        """The topic's descriptors from key `floor` on, by start offset, `AUDIT_PAGE_KEYS` at a
        time. Parsed outside `DescriptorReader.parse`'s memo: a long history is audited once,
        and its descriptors must not stay in memory for the query's life."""
        start_key = self._keys.object_key(topic, floor) if floor else self._keys.objects_prefix(topic)
        end_key = self._keys.cur_key(topic)
        while True:
            rows = self._metadata.get_range(start_key, end_key, AUDIT_PAGE_KEYS)
            page = [ObjectDescriptor.from_json(raw, key) for key, raw in rows
                    if keys.parse_object_key(key) is not None]
            if page:
                yield page
            if len(rows) < AUDIT_PAGE_KEYS:
                return
            start_key = rows[-1][0] + "\0"

    @staticmethod
    def _listing_bound(floor: int, cur: int | None, wal_stop: int | None) -> int | None:
        """Highest start offset the audit lists objects up to: none from offset 0 (the whole
        topic is read anyway); else past the known head by as much again as the stream is behind
        it, and `LISTING_MARGIN`, so the listing follows the stream's own offsets (an older
        run's object with no descriptor further above is not seen until a later audit)."""
        if floor == 0:
            return None
        head = max(cur or 0, wal_stop or 0, floor)
        return head + (head - floor) + LISTING_MARGIN

    def _audit_start(self, topic: TopicName, cur: int | None) -> int:
        """Key offset the run audit starts at: 0 (the whole topic) unless a stream said where
        it reads from (`read_from`)."""
        name = str(topic)
        if name not in self._read_from:
            return 0
        offset = self._read_from[name]
        if offset is None:
            return cur or 0
        return self.covering_start(topic, offset) if cur is None or offset < cur else cur

    def _last_offset_of(self, url: str, start: int) -> int:
        """Last offset of an object no descriptor describes (its frames scanned once)."""
        if url not in self._object_ranges:
            try:
                runs = scan_file_runs(url, self._storage_options)
            except ObjectMissingError:
                runs = []
            self._object_ranges[url] = max((r.stop_offset - 1 for r in runs), default=start)
        return self._object_ranges[url]

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


def _order(topic: TopicName) -> tuple:
    partition = topic.partition if topic.partition is not None else -1
    return (topic.namespace, topic.base_name, partition, topic.topic)
