"""A repeated upload: an object no descriptor references whose every frame is, byte for byte, a
frame of the described objects at the same offset.

An uploader that closes an object and then fails to put its descriptor (its broker killed, etcd
refusing the put) leaves the object in storage with no descriptor; whoever uploads those
offsets next (the same broker's next cycle; the next owner recovering the dead broker's WAL;
a v0.7.3 broker whose checkpoint did not move) copies the same WAL bytes into a new object under
a descriptor. The orphan then overlaps the described objects, which is also what an older run's
object looks like after offset reuse (spec §6.6) -- but there the offsets hold other messages.

The rule (`repeats_described`): the orphan is a repeated upload only if it is a non-empty run
of whole CRC-checked frames at consecutive offsets, ending exactly at its end (no torn or
corrupt tail), every one of its offsets is held by the given descriptors without a gap, and
each of its frames equals the described frame at that offset in every byte: the header
(offset, length, CRC) and the whole bincode `StreamMessage` (payload, producer id, request id,
publish time, producer name, attributes, schema, broker address). A real offset reuse cannot
pass: the older run's message at a reused offset is another send, which differs in at least one
of those bytes (two sends agreeing in producer id, request id, publish time in ms and payload are
one send), and one differing byte anywhere makes the whole object not a repeat. Anything
missing from the evidence (a frame that cannot be compared, an offset no descriptor holds)
answers False: the caller keeps treating the object as another run's, which fails loudly
naming it. Identical frames hold nothing the described objects do
not, so leaving the orphan unread (or deleting it) loses no message.

Objects are read as a stream from the descriptor's index entry at or below the orphan's first
offset (spec §4.5), in bounded chunks.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence

from danube_core.frames import STOP_CRC, scan_frames
from danube_core.objectstore import ObjectStore
from danube_core.records import ObjectDescriptor

COMPARE_CHUNK_BYTES = 1024 * 1024
_TORN = (-1, b"")  # a frame that is not whole or fails its CRC: nothing after it is compared


def object_frames(store: ObjectStore, path_or_url: str, start_pos: int = 0,
                  chunk_bytes: int = COMPARE_CHUNK_BYTES) -> Iterator[tuple[int, bytes]]:
    """(offset, frame bytes) of an object's whole CRC-checked frames from byte `start_pos` (a
    frame boundary); a torn or corrupt frame yields `(-1, b"")` and ends the walk.
    ObjectMissingError if the object is gone."""
    with store.open_reader(path_or_url, start_pos, chunk_bytes) as reader:
        carry = b""
        while True:
            data = reader.read(chunk_bytes)
            if not data:
                break
            buf = carry + data
            scan = scan_frames(buf)
            for ref in scan.frames:
                yield ref.offset, buf[ref.frame_pos:ref.end_pos]
            if scan.stop_reason == STOP_CRC:
                yield _TORN
                return
            carry = buf[scan.safe_end:]
        if carry:
            yield _TORN


def index_position(descriptor: ObjectDescriptor, offset: int) -> int:
    """Byte position of the last index entry at or below `offset` (0 without one, §4.6)."""
    entries = descriptor.offset_index or []
    i = bisect_right([o for o, _ in entries], offset)
    return entries[i - 1][1] if i else 0


def repeats_described(store: ObjectStore, orphan: str, first_offset: int,
                      described: Sequence[ObjectDescriptor], locate: Callable[[str], str]) -> bool:
    """Whether object `orphan` (path or URL), whose frames start at `first_offset`, is a
    repeated upload of `described` (module docstring); `locate` gives a described object's
    path or URL from its id. ObjectMissingError if an object is gone."""
    covering = sorted((d for d in described if d.end_offset >= first_offset), key=lambda d: d.start_offset)
    theirs = _described_frames(store, covering, first_offset, locate)
    expected, compared = first_offset, 0
    for offset, frame in object_frames(store, orphan):
        if offset != expected:  # torn, or not consecutive from the name's offset
            return False
        if next(theirs, _TORN) != (offset, frame):
            return False
        expected, compared = expected + 1, compared + 1
    return compared > 0


def _described_frames(store: ObjectStore, covering: Sequence[ObjectDescriptor], first_offset: int,
                      locate: Callable[[str], str]) -> Iterator[tuple[int, bytes]]:
    """The described frames from `first_offset` on, one per offset, each from the descriptor
    holding it; ends at the first gap between descriptors or at a frame out of place."""
    expected = first_offset
    for d in covering:
        if d.start_offset > expected:
            return  # a gap: the offsets after it are held by nothing compared here
        for offset, frame in object_frames(store, locate(d.object_id), index_position(d, expected)):
            if offset > d.end_offset:
                break
            if offset < expected:
                continue
            if offset != expected:
                yield _TORN
                return
            yield offset, frame
            expected += 1
        if expected <= d.end_offset:  # the object ended before its descriptor's end
            yield _TORN
            return
