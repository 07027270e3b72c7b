"""The frame decoder without a compiler: `_fastdecode`'s two entry points in Python and numpy.

`danube_core.arrow_decode` uses it where the C extension was not built (an install without a
C compiler). `decode` and `scan` take the same arguments and return the same tuples, with
numpy arrays or Arrow buffers where the C module returns its own, so everything around them (the Arrow
schema, the stop wording, a decode stop's detail from the Python codec) is shared and the
results are equal; the tests cross-check both against `decode_frames_reference`.

Why one module of ~560 lines: it is `_fastdecode.c` step for step (header walk, field cursor,
attribute spans, columns), and a change to the C decoder is mirrored here; one module each keeps
the two readable side by side.

It is not the reference's per-message codec. Only the header walk (each frame's length
locates the next) and the CRC (zlib) go frame by frame; the payloads are then decoded one
field at a time across all frames (`_Cursor`: one numpy step reads that field of every
message and marks the messages it fails for), and the first failing message ends the batch,
as in C. Strings are checked as UTF-8 once gathered into their columns (an all-ASCII column
needs one comparison); duplicate attribute keys keep the first key's position and the last
value, like a dict.
"""

from __future__ import annotations

import struct
import sys
import zlib
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# The C module's stop codes and column ids (danube_core/_fastdecode.c).
STOP_END, STOP_PARTIAL, STOP_CRC, STOP_DECODE, STOP_TOO_LARGE = range(5)
(C_OFFSET, C_REQUEST_ID, C_PRODUCER_ID, C_TOPIC_NAME, C_BROKER_ADDR, C_TOPIC_OFFSET, C_PAYLOAD,
 C_PUBLISH_TIME, C_PRODUCER_NAME, C_SUBSCRIPTION_NAME, C_ATTRIBUTES, C_SCHEMA_ID, C_SCHEMA_VERSION,
 C_FRAME_POS) = range(14)
N_COLS = 14

_LENGTH = struct.Struct("<I")  # a frame header's payload length, at byte 8 of the header
_HEADER_SIZE = 16
U64_MAX = 2**64 - 1
# Frames walked before their CRCs and limits are checked: a few at first (a read of 10 rows
# walks little further), doubling up to a size whose numpy steps cost little per frame.
_FIRST_CHUNK = 256
_MAX_CHUNK = 65536
_WIDE_VARINTS = {0xFB: 2, 0xFC: 4, 0xFD: 8}  # bincode varint marker -> value bytes
# A decode stop's err_field/err_reason: arrow_decode shows them only if the Python codec
# accepts a payload this module rejected (a bug it logs), so no field is tracked.
_REJECTED = ("payload", "rejected by the pure-Python decoder")
# Attribute entries are read one round (entry k of every message that has one) at a time
# while this many messages are left in the round, then message by message: a message with
# 100,000 attributes costs 100,000 small steps, not 100,000 numpy calls.
_ROUND_MIN_MESSAGES = 16
# Arrow binary views: values up to 12 bytes are held in the view, longer ones are addressed
# by an int32 offset into the input.
_VIEW_INLINE_BYTES = 12
# Per word of an inline value and per value length: the mask keeping the value's bytes.
_INLINE_MASKS = [
    np.array([sum(0xFF << 8 * k for k in range(4) if 4 * word + k < length) for length in range(13)], dtype=np.uint32)
    for word in range(3)
]
_VIEW_MAX_OFFSET = 2**31 - 1
_STRING_COLUMNS = (C_TOPIC_NAME, C_BROKER_ADDR, C_PRODUCER_NAME, C_SUBSCRIPTION_NAME)


def decode(buf, base_pos: int, min_offset: int, max_offset: int, max_rows: int, want: int,
           max_batch_bytes: int) -> tuple:
    """-> (rows, consumed, stop_code, stop_pos, err_field, err_reason, columns), as `_fastdecode.decode`."""
    view = _byte_view(buf)
    limit = sys.maxsize if max_rows < 0 else max_rows
    frames = _walk(view, min_offset, max_offset, limit, max(max_batch_bytes, 0))
    data = np.frombuffer(view, dtype=np.uint8)
    msgs = _decode_payloads(data, view, frames.positions + _HEADER_SIZE, frames.lengths)
    consumed, stop, stop_pos = frames.consumed, frames.stop, frames.stop_pos
    err_field = err_reason = None
    if msgs.rows < len(frames.positions):  # that message failed: the batch ends before its frame
        consumed = stop_pos = int(frames.positions[msgs.rows])
        stop = STOP_DECODE
        err_field, err_reason = _REJECTED
    frame_pos = frames.positions[: msgs.rows].astype(np.uint64) + np.uint64(base_pos)
    columns = _columns(msgs, frames.offsets[: msgs.rows], frame_pos, want)
    return msgs.rows, consumed, stop, stop_pos, err_field, err_reason, columns


def scan(buf, base_pos: int) -> tuple:
    """-> (offsets, frame_positions, count, consumed, stop_code), as `_fastdecode.scan`."""
    frames = _walk(_byte_view(buf), 0, U64_MAX, sys.maxsize, sys.maxsize)
    frame_pos = frames.positions.astype(np.uint64) + np.uint64(base_pos)
    return frames.offsets, frame_pos, len(frame_pos), frames.consumed, frames.stop


def _byte_view(buf) -> memoryview:
    view = memoryview(buf)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


# ---------------------------------------------------------------------------------------
# Frames: headers and CRCs


@dataclass
class _Frames:
    """The frames to decode (position, payload length, header offset) and where the walk stopped."""

    positions: np.ndarray
    lengths: np.ndarray
    offsets: np.ndarray
    consumed: int
    stop: int
    stop_pos: int | None


def _follow(view: memoryview, pos: int, count: int) -> tuple[list[int], int]:
    """Positions of up to `count` whole frames from `pos` (lengths only), and the position after."""
    size, unpack = len(view), _LENGTH.unpack_from
    positions: list[int] = []
    append = positions.append
    for _ in range(count):
        if size - pos < _HEADER_SIZE:
            break
        end = pos + _HEADER_SIZE + unpack(view, pos + 8)[0]
        if end > size:
            break
        append(pos)
        pos = end
    return positions, pos


def _walk(view: memoryview, min_offset: int, max_offset: int, max_rows: int, max_batch_bytes: int) -> _Frames:
    """The C loop's checks in its order, a chunk of frames at a time.

    Per frame: the row limit, then the CRC, then the offset range, then the batch size. Lengths
    are followed in Python (each locates the next frame); CRCs, ranges and limits are then
    checked for a whole chunk, the first frame failing one of them ends the walk.
    """
    data = np.frombuffer(view, dtype=np.uint8)
    u32, u64 = _unaligned(data, 4), _unaligned(data, 8)
    crc_of = zlib.crc32
    kept: list[np.ndarray] = []
    pos, rows, batch_bytes, chunk = 0, 0, 0, _FIRST_CHUNK
    while True:
        found, after = _follow(view, pos, chunk)
        at = np.array(found, dtype=np.int64)
        lengths = u32[at + 8].astype(np.int64)
        ends = at + _HEADER_SIZE + lengths
        crcs = np.fromiter(map(crc_of, map(view.__getitem__, map(slice, (at + _HEADER_SIZE).tolist(), ends.tolist()))),
                           dtype=np.uint32, count=len(found))
        offsets = u64[at]
        in_range = (offsets >= min_offset) & (offsets <= max_offset)
        in_range_bytes = np.where(in_range, lengths, 0)
        rows_before = rows + np.cumsum(in_range) - in_range
        bytes_before = batch_bytes + np.cumsum(in_range_bytes) - in_range_bytes
        stops = (
            (np.flatnonzero(rows_before >= max_rows), STOP_END),
            (np.flatnonzero(crcs != u32[at + 12]), STOP_CRC),
            (np.flatnonzero(in_range & (bytes_before + lengths > max_batch_bytes)), STOP_TOO_LARGE),
        )
        first = min(((int(hits[0]), code) for hits, code in stops if hits.size), default=None)
        end = len(found) if first is None else first[0]
        kept.append(at[:end][in_range[:end]])
        if first is not None:
            code = first[1]
            if code == STOP_TOO_LARGE and rows_before[end] > 0:  # rows so far make a batch
                code = STOP_END
            return _frames(kept, u32, u64, int(at[end]), code, None if code == STOP_END else int(at[end]))
        rows += int(np.count_nonzero(in_range))
        batch_bytes += int(lengths[in_range].sum())
        pos = after
        if len(found) < chunk:  # the buffer ends here, whole or with a partial frame
            if rows >= max_rows or pos == len(view):
                return _frames(kept, u32, u64, pos, STOP_END, None)
            return _frames(kept, u32, u64, pos, STOP_PARTIAL, pos)
        chunk = min(2 * chunk, _MAX_CHUNK)


def _frames(kept: list[np.ndarray], u32: np.ndarray, u64: np.ndarray, consumed: int, stop: int,
            stop_pos: int | None) -> _Frames:
    positions = np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)
    return _Frames(positions, u32[positions + 8].astype(np.int64), u64[positions], consumed, stop, stop_pos)


# ---------------------------------------------------------------------------------------
# Reading one field of every message at once


def _unaligned(data: np.ndarray, width: int) -> np.ndarray:
    """The little-endian integer of `width` bytes starting at every byte of `data`."""
    return np.ndarray(shape=(max(len(data) - width + 1, 0),), dtype=f"<u{width}", buffer=data, strides=(1,))


class _Cursor:
    """Per message: where its next field starts, where its payload ends, whether a read failed.

    A failed message's position stays within its payload, so its later (meaningless) reads
    stay within the buffer; it is cut from the batch, with every message after it.
    `rows` selects the messages a read applies to (None: all).
    """

    def __init__(self, data: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
        self.data = data
        self.last = max(len(data) - 1, 0)
        self.pos = start.copy()
        self.end = end
        self.bad = np.zeros(len(start), dtype=bool)
        self.wide = {width: _unaligned(data, width) for width in _WIDE_VARINTS.values()}

    def _at(self, rows):
        return (self.pos, self.end) if rows is None else (self.pos[rows], self.end[rows])

    def _advance(self, rows, pos: np.ndarray, failed: np.ndarray) -> None:
        if rows is None:
            self.pos = pos
            self.bad |= failed
        else:
            self.pos[rows] = pos
            self.bad[rows] |= failed

    def varint(self, rows, bits: int) -> np.ndarray:
        """A bincode varint for a u`bits` (spec §2.2): 0..250 inline, fb/fc/fd wider forms."""
        pos, end = self._at(rows)
        present = pos < end
        first = self.data[np.minimum(pos, self.last)]
        failed = ~present
        wide = present & (first > 250)
        if not wide.any():  # lengths, counts, small numbers: one byte each
            self._advance(rows, np.minimum(pos + 1, end), failed)
            return first.astype(np.uint64)
        size = _WIDE_VARINTS.get(int(first[0]), 0)
        if size and wide.all() and (first == first[0]).all():  # one form throughout (ids, times)
            fits = (size * 8 <= bits) & (end - pos > size)
            values = self.wide[size][np.minimum(pos + 1, len(self.wide[size]) - 1)]
            self._advance(rows, np.where(fits, pos + size + 1, end), ~fits)
            return values.astype(np.uint64)
        return self._mixed_varint(rows, bits, pos, end, first, failed, np.flatnonzero(wide))

    def _mixed_varint(self, rows, bits: int, pos: np.ndarray, end: np.ndarray, first: np.ndarray,
                      failed: np.ndarray, wide: np.ndarray) -> np.ndarray:
        values = first.astype(np.uint64)
        step = np.ones(len(pos), dtype=np.int64)
        marker = first[wide]
        width = np.zeros(wide.size, dtype=np.int64)
        for code, size in _WIDE_VARINTS.items():
            width[marker == code] = size
        fits = (width > 0) & (width * 8 <= bits) & (end[wide] - pos[wide] > width)
        failed[wide[~fits]] = True
        for size, view in self.wide.items():
            sel = wide[fits & (width == size)]
            if sel.size:
                values[sel] = view[pos[sel] + 1]
                step[sel] = size + 1
        self._advance(rows, np.minimum(pos + step, end), failed)
        return values

    def span(self, rows) -> tuple[np.ndarray, np.ndarray]:
        """A length-prefixed byte string: (start, length) of its bytes."""
        lengths = self.varint(rows, 64)
        pos, end = self._at(rows)
        fits = lengths <= (end - pos).astype(np.uint64)
        lengths = np.where(fits, lengths, 0).astype(np.int64)
        self._advance(rows, pos + lengths, ~fits)
        return pos, lengths

    def tag(self, rows) -> np.ndarray:
        """An Option tag (00 or 01): whether the value is present."""
        pos, end = self._at(rows)
        tags = self.data[np.minimum(pos, self.last)]
        valid = (pos < end) & (tags <= 1)
        self._advance(rows, np.minimum(pos + 1, end), ~valid)
        return valid & (tags == 1)

    def optional_varint(self, bits: int) -> tuple[np.ndarray, np.ndarray]:
        """Option<u`bits`>: (values, 0 where None; presence)."""
        present = self.tag(None)
        values = np.zeros(len(present), dtype=np.uint64)
        rows = np.flatnonzero(present)
        if rows.size:
            values[rows] = self.varint(rows, bits)
        return values, present


# ---------------------------------------------------------------------------------------
# Messages


@dataclass
class _Spans:
    """Byte strings in the input: where each starts and how long it is."""

    start: np.ndarray
    length: np.ndarray

    def head(self, rows: int) -> _Spans:
        return _Spans(self.start[:rows], self.length[:rows])


@dataclass
class _Messages:
    """The decoded fields of the first `rows` messages (each array may be longer)."""

    rows: int
    data: np.ndarray
    view: memoryview
    numbers: dict[int, np.ndarray]  # column id -> values
    strings: dict[int, _Spans]  # column id -> spans (payload included)
    present: dict[int, np.ndarray]  # nullable column id -> validity
    attr_counts: np.ndarray  # entries per message after de-duplication
    keys: _Spans
    values: _Spans
    gathered: dict[str, pa.BinaryArray] = field(default_factory=dict)

    def binary(self, name: str, spans: _Spans) -> pa.BinaryArray:
        """The bytes of `spans` (a prefix of what was gathered under `name` before, if anything)."""
        done = self.gathered.get(name)
        if done is None or len(done) < len(spans.start):
            done = self.gathered[name] = _gather(self.data, self.view, spans)
        return done if len(done) == len(spans.start) else done.slice(0, len(spans.start))


def _decode_payloads(data: np.ndarray, view: memoryview, start: np.ndarray, lengths: np.ndarray) -> _Messages:
    """Every field of every payload, in the Rust declaration order (spec §2.5)."""
    cur = _Cursor(data, start, start + lengths)
    numbers: dict[int, np.ndarray] = {}
    strings: dict[int, _Spans] = {}
    numbers[C_REQUEST_ID] = cur.varint(None, 64)
    numbers[C_PRODUCER_ID] = cur.varint(None, 64)
    strings[C_TOPIC_NAME] = _Spans(*cur.span(None))
    strings[C_BROKER_ADDR] = _Spans(*cur.span(None))
    numbers[C_TOPIC_OFFSET] = cur.varint(None, 64)
    strings[C_PAYLOAD] = _Spans(*cur.span(None))
    numbers[C_PUBLISH_TIME] = cur.varint(None, 64)
    strings[C_PRODUCER_NAME] = _Spans(*cur.span(None))
    has_sub = cur.tag(None)
    sub = _Spans(cur.pos.copy(), np.zeros(len(start), dtype=np.int64))  # None: an empty string
    sub_rows = np.flatnonzero(has_sub)
    if sub_rows.size:
        sub.start[sub_rows], sub.length[sub_rows] = cur.span(sub_rows)
    strings[C_SUBSCRIPTION_NAME] = sub
    counts, keys, values = _read_attributes(cur, view)
    numbers[C_SCHEMA_ID], has_schema_id = cur.optional_varint(64)
    schema_version, has_schema_version = cur.optional_varint(32)
    numbers[C_SCHEMA_VERSION] = schema_version.astype(np.uint32)
    failed = np.flatnonzero(cur.bad)
    rows = int(failed[0]) if failed.size else len(start)
    msgs = _Messages(rows, data, view, numbers, strings,
                     {C_SUBSCRIPTION_NAME: has_sub, C_SCHEMA_ID: has_schema_id, C_SCHEMA_VERSION: has_schema_version},
                     counts, keys, values)
    msgs.rows = min(rows, _first_invalid_utf8(msgs))
    _keep_last_value_per_key(msgs)
    return msgs


def _read_attributes(cur: _Cursor, view: memoryview) -> tuple[np.ndarray, _Spans, _Spans]:
    """HashMap<String, String>: entries per message, and their key and value spans in order."""
    counts = cur.varint(None, 64)
    # An entry takes at least 2 bytes (two lengths): a larger count fails on its own.
    cur.bad |= counts > ((cur.end - cur.pos) // 2).astype(np.uint64)
    counts = np.where(cur.bad, 0, counts).astype(np.int64)
    first = np.cumsum(counts) - counts
    total = int(counts.sum())
    keys = _Spans(np.zeros(total, dtype=np.int64), np.zeros(total, dtype=np.int64))
    values = _Spans(np.zeros(total, dtype=np.int64), np.zeros(total, dtype=np.int64))
    rows, k = np.flatnonzero(counts), 0
    while rows.size >= _ROUND_MIN_MESSAGES:
        slots = first[rows] + k
        keys.start[slots], keys.length[slots] = cur.span(rows)
        values.start[slots], values.length[slots] = cur.span(rows)
        k += 1
        rows = rows[counts[rows] > k]
    for row in rows.tolist():
        _read_entries_one_by_one(cur, view, row, int(first[row]) + k, int(first[row] + counts[row]), keys, values)
    return counts, keys, values


def _read_entries_one_by_one(cur: _Cursor, view: memoryview, row: int, slot: int, stop: int,
                             keys: _Spans, values: _Spans) -> None:
    pos, end = int(cur.pos[row]), int(cur.end[row])
    while slot < stop:
        for spans in (keys, values):
            read = _scalar_span(view, pos, end)
            if read is None:
                cur.bad[row] = True
                cur.pos[row] = end
                return
            spans.start[slot], spans.length[slot] = read
            pos = read[0] + read[1]
        slot += 1
    cur.pos[row] = pos


def _scalar_span(view: memoryview, pos: int, end: int) -> tuple[int, int] | None:
    """`_Cursor.span` for one message: (start, length), or None where it fails."""
    if pos >= end:
        return None
    first = view[pos]
    if first <= 250:
        length, pos = first, pos + 1
    else:
        width = _WIDE_VARINTS.get(first)
        if width is None or end - pos <= width:
            return None
        length, pos = int.from_bytes(view[pos + 1:pos + 1 + width], "little"), pos + 1 + width
    return (pos, length) if length <= end - pos else None


def _first_invalid_utf8(msgs: _Messages) -> int:
    """The first message (of msgs.rows) with a string that is not UTF-8, else msgs.rows."""
    rows = msgs.rows
    entry_rows = np.repeat(np.arange(len(msgs.attr_counts)), msgs.attr_counts)
    spans: list[tuple[str, _Spans, np.ndarray | None]]
    spans = [(str(c), msgs.strings[c].head(rows), None) for c in _STRING_COLUMNS]
    spans += [("keys", msgs.keys, entry_rows), ("values", msgs.values, entry_rows)]
    for name, span, owners in spans:
        if owners is not None:
            limit = int(np.searchsorted(owners, rows))
            span, owners = span.head(limit), owners[:limit]
        gathered = msgs.binary(name, span)
        data = np.frombuffer(gathered.buffers()[2] or b"", dtype=np.uint8)
        if not data.size or data.max() < 0x80:
            continue
        try:
            gathered.view(pa.string()).validate(full=True)
            continue
        except pa.ArrowInvalid:
            pass
        for i, (start, length) in enumerate(zip(span.start.tolist(), span.length.tolist())):
            try:
                bytes(msgs.view[start:start + length]).decode("utf-8")
            except UnicodeDecodeError:
                rows = min(rows, i if owners is None else int(owners[i]))
                break
    return rows


def _keep_last_value_per_key(msgs: _Messages) -> None:
    """Dict semantics for duplicate keys within a message: first position, last value."""
    counts = msgs.attr_counts[: msgs.rows]
    total = int(counts.sum())
    msgs.attr_counts, msgs.keys, msgs.values = counts, msgs.keys.head(total), msgs.values.head(total)
    first = np.cumsum(counts) - counts
    rows = _rows_with_duplicate_keys(msgs, counts, first)
    if not rows.size:
        return
    keep = np.ones(total, dtype=bool)
    keys, value_start, value_length = msgs.keys, msgs.values.start.copy(), msgs.values.length.copy()
    for row in rows.tolist():
        seen: dict[bytes, int] = {}
        for e in range(int(first[row]), int(first[row] + counts[row])):
            key = bytes(msgs.view[keys.start[e]:keys.start[e] + keys.length[e]])
            if key in seen:
                value_start[seen[key]], value_length[seen[key]] = value_start[e], value_length[e]
                keep[e] = False
            else:
                seen[key] = e
    msgs.gathered.pop("keys", None), msgs.gathered.pop("values", None)
    msgs.attr_counts = np.bincount(np.repeat(np.arange(msgs.rows), counts)[keep], minlength=msgs.rows)
    msgs.keys = _Spans(keys.start[keep], keys.length[keep])
    msgs.values = _Spans(value_start[keep], value_length[keep])


def _rows_with_duplicate_keys(msgs: _Messages, counts: np.ndarray, first: np.ndarray) -> np.ndarray:
    """The messages (ascending) in which an attribute key appears more than once.

    Two entries (the usual case beyond one) are compared directly, lengths first; messages with
    more are grouped by (message, key) in Arrow.
    """
    found = [np.zeros(0, dtype=np.int64)]
    pairs = np.flatnonzero(counts == 2)
    same_length = pairs[msgs.keys.length[first[pairs]] == msgs.keys.length[first[pairs] + 1]]
    if same_length.size:
        keys = msgs.binary("keys", msgs.keys)
        equal = pc.equal(keys.take(first[same_length]), keys.take(first[same_length] + 1))
        found.append(same_length[equal.to_numpy(zero_copy_only=False)])
    more = np.flatnonzero(counts > 2)
    if more.size:
        keys = msgs.binary("keys", msgs.keys)
        sizes = counts[more]
        entries = np.repeat(first[more] - (np.cumsum(sizes) - sizes), sizes) + np.arange(int(sizes.sum()))
        table = pa.table({"row": np.repeat(more, sizes), "key": keys.take(entries)})
        groups = table.group_by(["row", "key"]).aggregate([([], "count_all")])
        found.append(groups.filter(pc.greater(groups["count_all"], 1))["row"].to_numpy())
    return np.unique(np.concatenate(found))


# ---------------------------------------------------------------------------------------
# Columns, in the C module's layout


def _gather(data: np.ndarray, view: memoryview, spans: _Spans) -> pa.BinaryArray:
    """The spans' bytes as one binary array (int32 offsets, the values back to back).

    Built as Arrow's binary views over the input (each value's length and position; values up
    to 12 bytes inline), then cast: Arrow's cast copies the values in C++, which beats a
    per-value numpy gather or bytes.join several times over.
    """
    count = len(spans.start)
    if count == 0:
        return pa.array([], pa.binary())
    if int(spans.start[-1]) > _VIEW_MAX_OFFSET:  # views address the input with int32 offsets
        ends = spans.start + spans.length
        joined = b"".join(map(view.__getitem__, map(slice, spans.start.tolist(), ends.tolist())))
        offsets = np.zeros(count + 1, dtype=np.int32)
        np.cumsum(spans.length, out=offsets[1:])
        return pa.Array.from_buffers(pa.binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(joined)])
    views = np.zeros((count, 16), dtype=np.uint8)
    words = views.view("<u4")  # length, then the prefix, buffer index (0) and offset, or the value
    words[:, 0] = spans.length
    u32 = _unaligned(data, 4)
    long = spans.length > _VIEW_INLINE_BYTES
    if long.all():  # the usual case for payloads and longer names: no inline values
        words[:, 1] = u32[spans.start]
        words[:, 3] = spans.start
        return _cast_views(views, data, count)
    rows = np.flatnonzero(long)
    words[rows, 1] = u32[spans.start[rows]]
    words[rows, 3] = spans.start[rows]
    # Inline values: three 4-byte reads masked to the length, where 12 bytes are left to read.
    near_end = spans.start + _VIEW_INLINE_BYTES > len(data)
    rows = np.flatnonzero(~long & ~near_end)
    for word in range(3):
        words[rows, 1 + word] = u32[spans.start[rows] + 4 * word] & _INLINE_MASKS[word][spans.length[rows]]
    rows = np.flatnonzero(~long & near_end)
    for row in rows.tolist():
        start, length = int(spans.start[row]), int(spans.length[row])
        views[row, 4:4 + length] = data[start:start + length]
    return _cast_views(views, data, count)


def _cast_views(views: np.ndarray, data: np.ndarray, count: int) -> pa.BinaryArray:
    packed = pa.Array.from_buffers(pa.binary_view(), count, [None, pa.py_buffer(views), pa.py_buffer(data)])
    return packed.cast(pa.binary())


def _validity(present: np.ndarray) -> tuple[np.ndarray | None, int]:
    nulls = int(len(present) - np.count_nonzero(present))
    return (np.packbits(present, bitorder="little") if nulls else None), nulls


def _columns(msgs: _Messages, header_offsets: np.ndarray, frame_pos: np.ndarray, want: int) -> tuple:
    rows = msgs.rows
    out: list = [None] * N_COLS
    fixed = {**msgs.numbers, C_OFFSET: header_offsets, C_FRAME_POS: frame_pos}
    for col in range(N_COLS):
        if not want >> col & 1:
            continue
        validity, nulls = _validity(msgs.present[col][:rows]) if col in msgs.present else (None, 0)
        if col == C_ATTRIBUTES:
            out[col] = _attributes_column(msgs)
        elif col in fixed:
            out[col] = ([validity, np.ascontiguousarray(fixed[col][:rows])], nulls)
        else:
            _, offsets, data = msgs.binary(str(col), msgs.strings[col].head(rows)).buffers()
            out[col] = ([validity, offsets, data], nulls)
    return tuple(out)


def _attributes_column(msgs: _Messages) -> tuple:
    entry_offsets = np.zeros(msgs.rows + 1, dtype=np.int32)
    np.cumsum(msgs.attr_counts, out=entry_offsets[1:])
    _, key_offsets, key_data = msgs.binary("keys", msgs.keys).buffers()
    _, value_offsets, value_data = msgs.binary("values", msgs.values).buffers()
    return entry_offsets, len(msgs.keys.start), key_offsets, key_data, value_offsets, value_data
