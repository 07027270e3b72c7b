"""Reading what a topic's run audit needs: its descriptors, its objects in storage, its WAL runs.

`connectors.topic_runs` sorts a topic's stored sources into the current run and stale ones
without I/O; `TopicAuditor` reads those sources for it. Descriptors are read a page at a time
from the key the audit starts at, and the objects are listed once, bounded near the offsets a
stream reads (`read_from`) so a stream resuming near the head of a long history reads a few
keys, not the history. A clean run is folded page by page (`ContiguousRun`); anything else is
audited from the whole list. An object no descriptor references has its frames scanned once
for its last offset, unless it is an upload in flight.

Such an object is another run's only on evidence: an uploader that closed an object and died
(or failed) before putting its descriptor leaves it behind, and whoever uploads those offsets
next puts the same WAL bytes in a new object under a descriptor. An unreferenced object whose
every frame equals, byte for byte, the current run's frame at that offset (header and the whole
message: payload, producer id, request id, publish time, attributes; the rule and why a real
offset reuse cannot pass it are in `danube_core.repeated_upload`) is that repeated upload: it is
left out of the audit (logged once), as it holds no message the current run does not. Any
difference, a torn or corrupt frame, or an offset the current run's descriptors do not hold
keeps it an older run's object, and its offsets reused (data loss naming it). One driver thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Iterator

from connectors.descriptor_reads import DescriptorReader
from connectors.snapshot import WalRun
from connectors.topic_runs import (
    OBJECT, ContiguousRun, RunAudit, RunSource, audit_contiguous_run, audit_runs, current_chain, restart_in_wal,
)
from connectors.wal_scan import WalFinder, scan_file_runs
from danube_core import keys
from danube_core.errors import ObjectMissingError
from danube_core.metadata import MetadataStore
from danube_core.objectstore import ObjectStore, parse_object_id
from danube_core.records import CurPointer, ObjectDescriptor, SealedState
from danube_core.repeated_upload import repeats_described
from danube_core.topics import TopicName

logger = logging.getLogger(__name__)

AUDIT_PAGE_KEYS = 1024  # descriptors a run audit reads and parses at a time (about 1 MB parsed)
LISTING_MARGIN = 1024  # offsets past the head a run audit lists objects to (`_listing_bound`)


class TopicAuditor:
    """Makes topics' run audits for a catalog, which owns them (`audits`, filled by `audit`,
    the `run_audit` callback of `connectors.topic_head.TopicHeads`); `objects_url` gives a
    topic's objects directory, with a trailing slash."""

    def __init__(self, metadata: MetadataStore, storage_keys: keys.StorageKeys, store: ObjectStore,
                 storage_options: dict, wal: WalFinder | None, descriptors: DescriptorReader,
                 objects_url: Callable[[TopicName], str], audits: dict[str, RunAudit]) -> None:
        self._metadata = metadata
        self._keys = storage_keys
        self._store = store
        self._storage_options = storage_options
        self._wal = wal
        self._descriptors = descriptors
        self._objects_url = objects_url
        self._audits = audits
        self._object_ranges: dict[str, int] = {}  # orphan object URL -> its last offset
        # (orphan object URL, ids of the current objects holding its offsets) -> a repeated upload?
        self._repeats: dict[tuple[str, tuple[str, ...]], bool] = {}
        # topic -> the lowest offset a stream reads it from (None: from its head); a topic not
        # here is read from anywhere (batch reads), so its run audit covers its whole history.
        self._read_from: dict[str, int | None] = {}
        self._audited_from: dict[str, int] = {}  # topic -> descriptor key its run audit starts at

    def read_from(self, topic: str, offset: int | None) -> bool:
        """A stream reads `topic` from `offset` on (None: from its head); the topic's next audit
        starts at the descriptor holding the lowest such offset. True if its audit starts above
        `offset`, so the catalog must drop it and audit again."""
        if topic in self._read_from:
            known = self._read_from[topic]
            if offset is None or (known is not None and known <= offset):
                return False
        self._read_from[topic] = offset
        audited = self._audited_from.get(topic)
        return audited is not None and offset is not None and offset < audited

    def audit(self, topic: TopicName, sealed: SealedState | None, wal: list[WalRun],
              rescan: Callable[[int], list[WalRun]] | None = None) -> RunAudit:
        """Read the descriptors (from `_audit_start` on) and list the objects once, and sort
        them into runs: a clean run folded page by page (`ContiguousRun`), anything else from
        the whole list.

        `wal` was read before the descriptors. A broker uploading in between leaves
        descriptors above that WAL head, which is what a restart below the uploads looks like;
        so when the descriptors reach past `wal`, the WAL is read again through `rescan` (for
        the uploaded stop) before anything is judged: read after them, a WAL is below them only
        if the topic really restarted (its offsets only grow within a run, and an upload holds
        only what the WAL held)."""
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
        if rescan is not None and run.stop is not None and restart_in_wal(wal, run.stop) is not None:
            wal = rescan(run.stop)
        if run.clean and run.stop is not None and restart_in_wal(wal, run.stop) is None:
            newest = run.newest[-1].created_at
            unreferenced = [(oid, start, self._unless_in_flight(topic, oid, start, run.stop, newest))
                            for oid, start in run.unreferenced()]
            audit = audit_contiguous_run(str(topic), run, self._objects_url(topic), unreferenced, wal,
                                         stale_wal, sealed)
        if audit is None or not audit.clean:  # an unclean run's reads are planned from all of it
            audit = self._audit_whole(topic, floor, cur, listed_ids, sealed, wal, stale_wal, rescan)
        self._audits[str(topic)] = audit
        self._audited_from[str(topic)] = floor
        if not audit.clean:
            logger.warning("topic %s: %s", topic, audit.summary())
        audit.compact()
        return audit

    def _audit_whole(self, topic: TopicName, floor: int, cur: int | None, listed_ids: list[str],
                     sealed: SealedState | None, wal: list[WalRun], stale_wal: list[WalRun],
                     rescan: Callable[[int], list[WalRun]] | None = None) -> RunAudit:
        """The audit of a topic whose stored runs are not one clean run: every descriptor from
        `floor` on in memory at once (`current_chain` compares each with all); the WAL read
        again after them if they reach past it (`audit`)."""
        descriptors = [d for page in self._descriptor_pages(topic, floor) for d in page]
        chain, _ = current_chain(descriptors, cur)
        referenced = {d.object_id for d in descriptors}
        uploaded_stop = chain[-1].end_offset + 1 if chain else 0
        if rescan is not None and chain and restart_in_wal(wal, uploaded_stop) is not None:
            wal = rescan(uploaded_stop)
        newest = max((d.created_at for d in chain), default=0)
        listed = []
        for oid in listed_ids:
            start = parse_object_id(oid)[0]
            listed.append((oid, start, None if oid in referenced
                           else self._unless_in_flight(topic, oid, start, uploaded_stop, newest)))
        audit = audit_runs(str(topic), descriptors, cur, self._objects_url(topic), listed, wal, stale_wal, sealed)
        audit.stale_sources = [s for s in audit.stale_sources if not self._repeated_upload(topic, s, audit)]
        return audit

    def _repeated_upload(self, topic: TopicName, source: RunSource, audit: RunAudit) -> bool:
        """Whether `source` is an object no descriptor references that repeats the current
        run's frames (module docstring); decided once per object and covering descriptors."""
        if source.kind != OBJECT or source.referenced:
            return False
        holding = [d for d in audit.current_descriptors
                   if d.end_offset >= source.first_offset and d.start_offset <= source.last_offset]
        memo_key = (source.url, tuple(d.object_id for d in holding))
        if memo_key not in self._repeats:
            self._repeats[memo_key] = self._repeats_current(topic, source, holding)
        return self._repeats[memo_key]

    def _repeats_current(self, topic: TopicName, source: RunSource, holding: list[ObjectDescriptor]) -> bool:
        objects_url = self._objects_url(topic)
        try:
            repeated = repeats_described(self._store, source.url, source.first_offset, holding,
                                         lambda object_id: objects_url + object_id)
        except ObjectMissingError:
            # Gone since it was listed (its uploader deleted it): it holds nothing, as if not
            # listed. A current object gone is the planner's data loss to report.
            return not self._store.exists(source.url)
        if repeated:
            logger.warning("topic %s: object %s (offsets %d..%d, no descriptor references it) repeats the "
                           "current run's frames in %s byte for byte: an upload whose descriptor was never "
                           "written, not read (safe to delete)", topic, source.name, source.first_offset,
                           source.last_offset, ", ".join(d.object_id for d in holding))
        return repeated

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
        return self._descriptors.covering_start(topic, offset) if cur is None or offset < cur else cur

    def _last_offset_of(self, url: str, start: int) -> int:
        """Last offset of an object no descriptor describes (its frames scanned once)."""
        if url not in self._object_ranges:
            try:
                runs = scan_file_runs(url, self._storage_options)
            except ObjectMissingError:
                runs = []
            self._object_ranges[url] = max((r.stop_offset - 1 for r in runs), default=start)
        return self._object_ranges[url]
