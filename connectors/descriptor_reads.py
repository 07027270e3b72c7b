"""Reading a topic's object descriptors from etcd by key range (spec §5.2), never its whole history.

Descriptor keys are `<objects prefix>/<padded start offset>`, so a range from a padded start key
reads a topic forward from any offset: the newest run through the `cur` pointer
(`above_cur`), a span from the descriptor holding an offset (`overlapping`), and that
descriptor's key found by a short search (`covering_start`). Parsed descriptors are kept by
(key, stored bytes), since a stream's trigger reads the same keys twice. One driver thread.
"""

from __future__ import annotations

from collections.abc import Callable

from connectors.topic_runs import RunAudit
from danube_core import keys
from danube_core.metadata import MetadataStore
from danube_core.records import CurPointer, ObjectDescriptor
from danube_core.topics import TopicName

PARSED_MEMO_SLACK, PARSED_MEMO_MIN = 4, 1024  # descriptors kept parsed: see DescriptorReader.parse


class DescriptorReader:
    """A topic's descriptors by key range; `on_memo_reset` runs when the parse memo is dropped
    (what is kept per parsed descriptor elsewhere goes with it)."""

    def __init__(self, metadata: MetadataStore, storage_keys: keys.StorageKeys,
                 on_memo_reset: Callable[[], None] = lambda: None) -> None:
        self._metadata = metadata
        self._keys = storage_keys
        self._on_memo_reset = on_memo_reset
        self._parsed: dict[tuple[str, bytes], ObjectDescriptor] = {}
        self._parsed_peak = 0  # the most rows one read returned
        self._spans: dict[str, list[tuple[int, int]]] = {}  # topic -> (start, end) last returned

    def parse(self, rows: list[tuple[str, bytes]]) -> list[ObjectDescriptor]:
        """Descriptors of the object keys among `rows`. A stream's trigger reads the same keys
        twice (`latestOffset`, then `partitions`), and a backlog's are most of its planning
        CPU, so parsed ones are kept by (key, stored bytes): a key written anew parses anew.
        The memo is dropped once it outgrows the largest read several times over (keys
        retention deleted or rewritten)."""
        out = []
        for key, raw in rows:
            parsed = self._parsed.get((key, raw))
            if parsed is None and keys.parse_object_key(key) is not None:
                parsed = self._parsed[(key, raw)] = ObjectDescriptor.from_json(raw, key)
            if parsed is not None:
                out.append(parsed)
        self._parsed_peak = max(self._parsed_peak, len(rows))
        if len(self._parsed) > PARSED_MEMO_SLACK * self._parsed_peak + PARSED_MEMO_MIN:
            self._parsed = {}
            self._on_memo_reset()
        return out

    def first(self, topic: TopicName) -> list[ObjectDescriptor]:
        """The topic's lowest descriptor (none if it has none), one 1-key range read."""
        first_key = self._keys.object_key(topic, 0)
        return self.parse(self._metadata.get_range(first_key, self._keys.cur_key(topic), limit=1))

    def above_cur(self, topic: TopicName) -> tuple[int | None, list[ObjectDescriptor]]:
        """(`cur`'s start, the descriptors from `cur` on): usually one key, the newest upload."""
        cur_key = self._keys.cur_key(topic)
        raw = self._metadata.get(cur_key)
        start_key = self._keys.objects_prefix(topic)
        cur = None
        if raw is not None:
            cur = int(CurPointer.from_json(raw, cur_key).start)
            start_key = self._keys.object_key(topic, cur)
        descriptors = self.parse(self._metadata.get_range(start_key, cur_key))
        if not descriptors and raw is not None:  # `cur` names a key that no longer exists
            descriptors = self.parse(self._metadata.get_range(self._keys.objects_prefix(topic), cur_key))
            cur = None
        return cur, descriptors

    def holding(self, topic: TopicName, last: ObjectDescriptor) -> None:
        """`last` is where the next read of `topic` starts (a stream at its head): no search."""
        self._spans[str(topic)] = [(last.start_offset, last.end_offset)]

    def overlapping(self, topic: TopicName, from_offset: int, stop: int,
                    audit: RunAudit | None) -> list[ObjectDescriptor]:
        """Descriptors overlapping [from_offset, stop), in start order, read by key range; an
        audit's stale descriptors left out (`audit` unclean: the current run comes from it).

        The range starts at the descriptor that held `from_offset` in the previous read of the
        topic (a stream moves forward through it) when it still does, else at the one
        `covering_start` finds.
        """
        stop_key = self._keys.object_key(topic, stop)
        if audit is not None and not audit.clean:
            # Stale keys sit between current ones: the current run comes from the audit, and
            # only what was uploaded after it from etcd.
            known = audit.current_descriptors
            newer_from = known[-1].end_offset + 1 if known else 0
            newer = self.parse(self._metadata.get_range(self._keys.object_key(topic, newer_from), stop_key))
            audit.advance([d for d in newer if d.start_offset >= newer_from])
            found = [d for d in audit.current_descriptors if d.start_offset < stop]
        else:
            hint = next((a for a, b in self._spans.get(str(topic), ()) if a <= from_offset <= b), None)
            found = []
            if hint is not None:
                found = self.parse(self._metadata.get_range(self._keys.object_key(topic, hint), stop_key))
            if not (found and found[0].start_offset == hint and found[0].end_offset >= from_offset):
                start_key = self._keys.object_key(topic, self.covering_start(topic, from_offset))
                found = self.parse(self._metadata.get_range(start_key, stop_key))
        stale = audit.stale_ids() if audit is not None else set()
        descriptors = [d for d in found if d.end_offset >= from_offset and d.object_id not in stale]
        self._spans[str(topic)] = [(d.start_offset, d.end_offset) for d in descriptors]
        return descriptors

    def covering_start(self, topic: TopicName, offset: int) -> int:
        """Start key of the descriptor holding `offset`: `offset` itself or the nearest key below.

        etcd ranges only go forward, so the nearest key below is found by doubling a window
        down from `offset` and then bisecting it with 1-key range reads (~2·log2 distance).
        """

        def first_key_in(lo: int, hi: int) -> int | None:
            lo_key, hi_key = self._keys.object_key(topic, lo), self._keys.object_key(topic, hi)
            rows = self._metadata.get_range(lo_key, hi_key, limit=1)
            return keys.parse_object_key(rows[0][0]) if rows else None

        if offset == 0:
            return 0
        width, found = 1, None
        while found is None:
            lo = max(0, offset - width)
            found = first_key_in(lo, offset)
            if found is None and lo == 0:
                return offset
            width *= 2
        hi = offset
        while found + 1 < hi:
            mid = (found + 1 + hi) // 2
            nxt = first_key_in(mid, hi)
            if nxt is None:
                hi = mid
            else:
                found = nxt
        return found
