"""Serving a start offset from cloud objects, then the local WAL, then live appends (spec §6.5).

The v0.7.3 broker consults the cloud only when the requested offset is below the WAL
checkpoint's `start_offset`, which its writer always sets to 0, so after a move to another
host a consumer behind the new WAL's first offset silently skips everything in between. This
reader does what the contract implies instead: offsets `[o, first offset the WAL has)` come
from the descriptors and objects, the rest from the WAL, and **no offset is ever skipped**: a
hole between objects, inside an object, or between the last object and the WAL raises
`DataLossError` naming the topic, the offset range and the object.

Descriptors are found without scanning the topic's history: `DescriptorCatalog` reads the
`cur` pointer and zero-padded key ranges (§5.2), so opening a reader costs a handful of etcd
range reads whatever the number of objects.
"""

from __future__ import annotations

import logging
import threading
from itertools import chain
from typing import Generator, Iterator

from danube_core.errors import (
    CorruptFrameError,
    DataLossError,
    ObjectMissingError,
    PayloadDecodeError,
)
from danube_core.frames import FRAME_HEADER, FRAME_HEADER_SIZE, STOP_CRC, scan_frames
from danube_core.keys import StorageKeys
from danube_core.message import StreamMessage, decode_message, with_offset
from danube_core.descriptor_catalog import DescriptorCatalog
from danube_core.metadata import MetadataStore
from danube_core.objectstore import ObjectStore
from danube_core.records import ObjectDescriptor
from danube_core.topics import TopicName

from broker.wal import Wal

logger = logging.getLogger(__name__)

DEFAULT_RANGE_BYTES = 4 * 1024 * 1024  # the broker's cloud reader reads 4 MiB ranges (§4.6)


class TieredReader:
    """Reads a topic from any offset: objects, then the local WAL, then (follow) live appends.

    `wal` is None for a cloud-only reader. Offsets below `wal_floor` are always read from
    objects: local WAL files left by an earlier incarnation on this host may disagree with
    what a later owner uploaded for the same offsets. `closed_event`, when given, ends a
    following read once set (the owning topic was unloaded or closed).
    """

    def __init__(
        self,
        topic: TopicName | str,
        metadata: MetadataStore,
        keys: StorageKeys,
        store: ObjectStore,
        wal: Wal | None,
        *,
        range_bytes: int = DEFAULT_RANGE_BYTES,
        poll_interval_s: float = 0.5,
        wal_floor: int = 0,
        closed_event: threading.Event | None = None,
    ) -> None:
        self._topic = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        self._catalog = DescriptorCatalog(metadata, keys, self._topic)
        self._store = store
        self._wal = wal
        self._range_bytes = range_bytes
        self._poll_interval_s = poll_interval_s
        self._wal_floor = wal_floor
        self._closed_event = closed_event

    def read(
        self, from_offset: int, *, follow: bool = False, stop_event: threading.Event | None = None
    ) -> Iterator[StreamMessage]:
        """Every message from `from_offset` on, exactly once and in offset order.

        Without `follow` it ends at the head as seen while reading; with `follow` it then
        waits for new appends until `stop_event` (or the reader's `closed_event`) is set.
        """
        if from_offset < 0:
            raise ValueError(f"read of {self._topic} from offset {from_offset}: expected an offset >= 0")
        stop = stop_event if stop_event is not None else threading.Event()
        pos = from_offset
        stalled_at: int | None = None
        while not stop.is_set():
            wal_first = self._wal_first(pos)
            if wal_first == pos:
                pos, complete = yield from self._read_wal(pos)
                if not complete:
                    continue  # retention removed a segment meanwhile: the objects have it
            else:
                pos = yield from self._read_cloud(pos, wal_first)
                if wal_first is not None:
                    continue
                if self._wal is not None and self._wal.next_offset > pos:
                    # Appended since the peek, or the WAL lost it: look once more, then fail.
                    if stalled_at == pos:
                        raise self._loss(pos, self._wal.next_offset - 1,
                                         "the local WAL's head is past them but it holds none of them")
                    stalled_at = pos
                    continue
            if not follow or not self._wait_for(pos, stop):
                return

    # ---- WAL ------------------------------------------------------------------------------

    def _wal_first(self, pos: int) -> int | None:
        """First offset >= max(`pos`, floor) the WAL can serve now; None if none (or no WAL)."""
        if self._wal is None:
            return None
        on_disk = [s.first_offset for s in self._wal.segments() if s.first_offset is not None]
        start = max(pos, self._wal_floor, on_disk[0] if on_disk else 0)
        messages = self._wal.read(start)
        try:
            first = next(messages, None)
        finally:
            messages.close()
        return None if first is None else first.msg_id.topic_offset

    def _read_wal(self, pos: int) -> Generator[StreamMessage, None, tuple[int, bool]]:
        """Yield WAL messages from `pos`; returns (next pos, False if the WAL skipped one)."""
        assert self._wal is not None, "called only once _wal_first found the WAL serves pos"
        for msg in self._wal.read(pos):
            offset = msg.msg_id.topic_offset
            if offset < pos:
                continue
            if offset > pos:
                return pos, False
            yield msg
            pos += 1
        return pos, True

    def _wait_for(self, pos: int, stop: threading.Event) -> bool:
        """Block until `pos` may be readable; False once the read must end."""
        while not stop.is_set():
            if self._closed_event is not None and self._closed_event.is_set():
                return False
            if self._wal is None:
                return not stop.wait(self._poll_interval_s)
            if self._wal.wait_for(pos, self._poll_interval_s):
                return True
            stop.wait(0.01)  # a closed WAL answers at once: do not spin
        return False

    # ---- cloud ----------------------------------------------------------------------------

    def _read_cloud(self, pos: int, wal_first: int | None) -> Generator[StreamMessage, None, int]:
        """Yield offsets `[pos, wal_first)` (open-ended if None) from objects; returns next pos."""
        end = None if wal_first is None else wal_first - 1
        covering = self._catalog.at_or_before(pos)
        following = self._catalog.iter_from(pos + 1)
        descriptors = chain([covering], following) if covering is not None else following
        previous = covering
        for descriptor in descriptors:
            if end is not None and pos > end:
                break
            if descriptor.end_offset < pos:
                previous = descriptor
                continue
            if descriptor.start_offset > pos:
                if end is not None and descriptor.start_offset > end:
                    break
                raise self._loss(pos, descriptor.start_offset - 1, f"no object holds them; the next object "
                                 f"{descriptor.object_id} starts at {descriptor.start_offset}", previous)
            pos = yield from self._read_object(descriptor, pos, end)
            previous = descriptor
        if wal_first is not None and pos < wal_first:
            raise self._loss(pos, wal_first - 1,
                             f"they are in no object and the local WAL starts at {wal_first}", previous)
        return pos

    def _read_object(
        self, descriptor: ObjectDescriptor, pos: int, end: int | None
    ) -> Generator[StreamMessage, None, int]:
        """Yield `[pos, min(end, descriptor.end_offset)]` from one object, CRC-checked."""
        path = self._store.object_path(self._topic, descriptor.object_id)
        source = self._store.object_url(self._topic, descriptor.object_id)
        last = descriptor.end_offset if end is None else min(end, descriptor.end_offset)
        try:
            size = self._store.size(path)
        except ObjectMissingError as exc:
            raise self._loss(pos, last, f"object {source} named by its descriptor is missing") from exc
        read_pos = _index_position(descriptor, pos)
        carry = b""
        while read_pos < size and pos <= last:
            want = max(self._range_bytes, pending_frame_bytes(carry) - len(carry))
            chunk = self._store.read_range(path, read_pos, min(size, read_pos + want))
            if not chunk:
                break
            buf, base = carry + chunk, read_pos - len(carry)
            read_pos += len(chunk)
            pos, safe_end = yield from self._frames(buf, base, source, descriptor, pos, last)
            carry = buf[safe_end:]
        if pos <= last:
            raise self._loss(pos, last, f"object {source} ends before its descriptor's end_offset "
                             f"{descriptor.end_offset}", descriptor)
        return pos

    def _frames(
        self, buf: bytes, base: int, source: str, descriptor: ObjectDescriptor, pos: int, last: int
    ) -> Generator[StreamMessage, None, tuple[int, int]]:
        """Yield the wanted frames of `buf` (object bytes from `base`); returns (next pos,
        end of the whole frames in `buf`), the rest being a frame cut by the range."""
        scan = scan_frames(buf)
        for ref in scan.frames:
            if ref.offset < pos:
                continue
            if ref.offset > last:
                return pos, scan.safe_end
            if ref.offset > pos:
                raise self._loss(pos, ref.offset - 1, f"object {source} skips from offset {pos - 1} "
                                 f"to {ref.offset} at byte {base + ref.frame_pos}", descriptor)
            try:
                msg = decode_message(buf[ref.payload_pos : ref.end_pos])
            except PayloadDecodeError as exc:
                raise CorruptFrameError(source, ref.offset, base + ref.frame_pos, str(exc)) from exc
            if msg.msg_id.topic_offset != ref.offset:
                msg = with_offset(msg, ref.offset)  # the frame header is authoritative (§2.6)
            yield msg
            pos += 1
        if scan.stop_reason == STOP_CRC:
            assert scan.stop_pos is not None  # a scan that stopped says where
            offset = FRAME_HEADER.unpack_from(buf, scan.stop_pos)[0]
            raise CorruptFrameError(source, offset, base + scan.stop_pos, "CRC mismatch")
        return pos, scan.safe_end

    def _loss(
        self, first: int, last: int, why: str, descriptor: ObjectDescriptor | None = None
    ) -> DataLossError:
        near = (f" (nearest object {descriptor.object_id}: offsets {descriptor.start_offset}.."
                f"{descriptor.end_offset})" if descriptor is not None else "")
        return DataLossError(f"topic {self._topic}: offsets {first}..{last} cannot be read: {why}{near}")


def pending_frame_bytes(carry: bytes) -> int:
    """Total size of the incomplete frame at the start of `carry` (0 if its header is short)."""
    if len(carry) < FRAME_HEADER_SIZE:
        return 0
    return FRAME_HEADER_SIZE + FRAME_HEADER.unpack_from(carry)[1]


def _index_position(descriptor: ObjectDescriptor, pos: int) -> int:
    """Byte position of the last sparse-index entry at or before `pos` (0 without one)."""
    best = 0
    for offset, byte_pos in descriptor.offset_index or ():
        if offset > pos:
            break
        best = byte_pos
    return best
