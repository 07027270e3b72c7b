"""Bulk decoding of WAL frames (spec §1) with bincode payloads (spec §2) into Arrow columns.

This is the hot path of every reader (WAL replay, cloud objects, the Spark connector): a
buffer of frames becomes one `pyarrow.RecordBatch` in a single pass of C code
(`danube_core._fastdecode`) that checks every CRC, decodes every payload, validates UTF-8
and writes Arrow buffers directly, without holding the GIL. Where that extension was not built
(installed without a C compiler), `danube_core.pure_decode` does the same work with numpy,
with the same results at a fraction of the rate (bench/README.md): which one runs is decided
once, at import, and the fallback is logged once. `decode_frames_reference` does the same
with the pure-Python codec (`danube_core.message.decode_message`); the tests cross-check both
decoders against it on random messages, so neither becomes a second, diverging definition of
the format.

Neither decoder raises on bad data: they stop at the first partial, corrupt or undecodable
frame and say where (`DecodedFrames.stop_reason`). Whether that is an error is the caller's
decision (spec §1.4): WAL readers stop quietly, cloud readers fail hard
(`DecodedFrames.raise_if_corrupt`).
"""

from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from danube_core import pure_decode
from danube_core.errors import CorruptFrameError, PayloadDecodeError
from danube_core.frames import (
    FRAME_HEADER,
    FRAME_HEADER_SIZE,
    STOP_CRC,
    STOP_END,
    STOP_PARTIAL,
    FrameRef,
    scan_frames,
)
from danube_core.message import StreamMessage, decode_message

logger = logging.getLogger(__name__)

# What a reader without the C decoder gives up (bench/README.md, "Decoding frames").
PURE_DECODER_COST = "about 1/14 of the C decoder's messages per CPU second"


def _frame_decoder() -> ModuleType:
    """The C decoder where it was built, else the pure one (said once, here)."""
    try:
        from danube_core import _fastdecode  # type: ignore[attr-defined]  # the compiled extension
    except ImportError as exc:  # installed without a C compiler, or a checkout never built
        logger.warning(
            "danube_core._fastdecode (the C frame decoder) is not built (%s): decoding frames with "
            "danube_core.pure_decode instead, same results at %s; install danube-spark with a C compiler "
            "present, or its wheel, to get it back", exc, PURE_DECODER_COST)
        return pure_decode
    return _fastdecode


FRAME_DECODER = _frame_decoder()

STOP_DECODE = "decode"
U64_MAX = 2**64 - 1
# Arrow string/binary/map columns use int32 offsets, so one batch holds at most this many
# payload bytes (every column's bytes are bounded by the sum of the payload lengths).
MAX_BATCH_BYTES = 2**31 - 1

_ATTRIBUTES_TYPE = pa.map_(pa.string(), pa.string())

MESSAGE_ARROW_SCHEMA = pa.schema(
    [
        pa.field("offset", pa.uint64(), nullable=False),  # frame header offset
        pa.field("request_id", pa.uint64(), nullable=False),
        pa.field("producer_id", pa.uint64(), nullable=False),
        pa.field("topic_name", pa.string(), nullable=False),
        pa.field("broker_addr", pa.string(), nullable=False),
        pa.field("topic_offset", pa.uint64(), nullable=False),  # msg_id.topic_offset (payload)
        pa.field("payload", pa.binary(), nullable=False),
        pa.field("publish_time", pa.uint64(), nullable=False),  # ms since the Unix epoch
        pa.field("producer_name", pa.string(), nullable=False),
        pa.field("subscription_name", pa.string()),
        pa.field("attributes", _ATTRIBUTES_TYPE, nullable=False),
        pa.field("schema_id", pa.uint64()),
        pa.field("schema_version", pa.uint32()),
        pa.field("frame_pos", pa.uint64(), nullable=False),  # base_pos + header position
    ]
)
_COLUMN_INDEX = {name: i for i, name in enumerate(MESSAGE_ARROW_SCHEMA.names)}
# Stop codes of the C module (its enum order); "too large" is reported as a decode stop.
_C_STOP_REASONS = (STOP_END, STOP_PARTIAL, STOP_CRC)
_C_STOP_DECODE = 3
_C_STOP_TOO_LARGE = 4


@dataclass
class DecodedFrames:
    """The rows of one decode call and where (and why) it stopped.

    `consumed` counts the bytes of `buf` covered by whole good frames (the safe prefix end):
    the next call resumes there. `stop_reason` is "end" (buffer exhausted, or `max_frames`
    rows / the batch size limit reached), "partial" (incomplete trailing frame: wait for more
    bytes), "crc" (the frame at `stop_pos` fails its CRC) or "decode" (its payload is not a
    valid StreamMessage). `stop_pos` is the stopping frame's header position, like
    `frame_pos` including `base_pos`; `stop_offset` its header offset when it could be read.
    """

    batch: pa.RecordBatch
    consumed: int
    stop_reason: str
    stop_pos: int | None
    stop_detail: str | None
    stop_offset: int | None = None

    def raise_if_corrupt(self, source: str) -> None:
        """Fail hard on a CRC or payload error, as the broker's cloud reader does (§1.4).

        A partial trailing frame is not corruption and is left to the caller.
        """
        if self.stop_reason in (STOP_CRC, STOP_DECODE):
            assert self.stop_pos is not None and self.stop_detail is not None
            raise CorruptFrameError(source, self.stop_offset, self.stop_pos, self.stop_detail)


def decode_frames(
    buf: bytes | bytearray | memoryview,
    *,
    base_pos: int = 0,
    min_offset: int = 0,
    max_offset: int = U64_MAX,
    max_frames: int | None = None,
    columns: Sequence[str] | None = None,
    _max_batch_bytes: int = MAX_BATCH_BYTES,
    _decoder: ModuleType = FRAME_DECODER,
) -> DecodedFrames:
    """Decode the frames at the start of `buf` into one RecordBatch (zero-copy input).

    Every frame's CRC is checked. Frames whose header offset is outside
    [min_offset, max_offset] (inclusive) are skipped but still CRC-checked and consumed;
    their payloads are not decoded. At most `max_frames` rows are returned. `columns`
    selects (and orders) the columns to build; the others cost no copying. `base_pos` is
    the position of `buf` in its file, added to `frame_pos` and `stop_pos`. A "decode" stop's
    detail is the Python codec's own error for that payload (found again on this cold path),
    so it reads exactly as the reference's. `_max_batch_bytes` exists for tests of the
    int32-offset limit, `_decoder` (`_fastdecode` or `pure_decode`) for tests and benchmarks
    of each decoder.
    """
    names = _selected_columns(columns)
    _check_args(buf, base_pos, min_offset, max_offset, max_frames)
    want = sum(1 << _COLUMN_INDEX[name] for name in names)
    row_limit = -1 if max_frames is None else max_frames
    rows, consumed, code, stop_rel, field, reason, cols = _decoder.decode(
        buf, base_pos, min_offset, max_offset, row_limit, want, _max_batch_bytes
    )
    arrays = [_fast_array(name, rows, cols[_COLUMN_INDEX[name]]) for name in names]
    batch = pa.RecordBatch.from_arrays(arrays, schema=_schema_of(names))
    view = _byte_view(buf)
    if code == _C_STOP_TOO_LARGE:
        return _too_large_stop(batch, view, stop_rel, base_pos, _max_batch_bytes)
    if code == _C_STOP_DECODE:
        error = _reference_decode_error(view, stop_rel)
        if error is None:  # the two decoders disagree: a bug in one of them
            logger.error("only %s rejects the frame at byte %s", _decoder.__name__, base_pos + stop_rel)
            error = f"{field}: {reason}"
        return _decode_stop(batch, view, consumed, stop_rel, base_pos, error)
    return _stopped(batch, view, consumed, _C_STOP_REASONS[code], stop_rel, base_pos)


def decode_frames_reference(
    buf: bytes | bytearray | memoryview,
    *,
    base_pos: int = 0,
    min_offset: int = 0,
    max_offset: int = U64_MAX,
    max_frames: int | None = None,
    columns: Sequence[str] | None = None,
    _max_batch_bytes: int = MAX_BATCH_BYTES,
) -> DecodedFrames:
    """`decode_frames` built from `scan_frames` + `decode_message`: slow, obviously right.

    Same arguments, same result (the tests compare the two); use it to check the C decoder,
    never in a reader.
    """
    names = _selected_columns(columns)
    _check_args(buf, base_pos, min_offset, max_offset, max_frames)
    view = _byte_view(buf)
    scan = scan_frames(view)
    rows: list[tuple[int, int, StreamMessage]] = []
    consumed = batch_bytes = 0
    for ref in scan.frames:
        if max_frames is not None and len(rows) >= max_frames:
            break
        if not min_offset <= ref.offset <= max_offset:
            consumed = ref.end_pos
            continue
        if batch_bytes + ref.payload_len > _max_batch_bytes:
            batch = _reference_batch(names, rows)
            if rows:
                return DecodedFrames(batch, consumed, STOP_END, None, None)
            return _too_large_stop(batch, view, ref.frame_pos, base_pos, _max_batch_bytes)
        try:
            msg = decode_message(view[ref.payload_pos : ref.end_pos])
        except PayloadDecodeError as exc:
            batch = _reference_batch(names, rows)
            return _decode_stop(batch, view, consumed, ref.frame_pos, base_pos, str(exc))
        rows.append((ref.offset, base_pos + ref.frame_pos, msg))
        batch_bytes += ref.payload_len
        consumed = ref.end_pos
    batch = _reference_batch(names, rows)
    if max_frames is not None and len(rows) >= max_frames:
        return DecodedFrames(batch, consumed, STOP_END, None, None)
    return _stopped(batch, view, consumed, scan.stop_reason, scan.stop_pos, base_pos)


def scan_frame_offsets(
    buf: bytes | bytearray | memoryview, base_pos: int = 0, *, _decoder: ModuleType = FRAME_DECODER
) -> tuple[np.ndarray, np.ndarray, int, str]:
    """Header-only walk of the safe prefix (CRC checked, payloads not decoded).

    Returns (offsets, frame positions incl. `base_pos`, consumed bytes, stop_reason) with
    both arrays uint64; for planners, the uploader and offset indexes.
    """
    _check_args(buf, base_pos, 0, U64_MAX, None)
    offsets, positions, count, consumed, code = _decoder.scan(buf, base_pos)
    return (
        np.frombuffer(offsets, dtype="<u8", count=count),
        np.frombuffer(positions, dtype="<u8", count=count),
        consumed,
        _C_STOP_REASONS[code],
    )


# ---------------------------------------------------------------------------------------
# Arguments


def _selected_columns(columns: Sequence[str] | None) -> list[str]:
    if columns is None:
        return list(MESSAGE_ARROW_SCHEMA.names)
    if isinstance(columns, str):
        raise ValueError(f"columns must be a list of column names, not the string {columns!r}")
    names = list(columns)
    unknown = [name for name in names if name not in _COLUMN_INDEX]
    if unknown or not names or len(set(names)) != len(names):
        raise ValueError(
            f"columns {names!r} must be distinct, non-empty and taken from "
            f"{MESSAGE_ARROW_SCHEMA.names}" + (f"; unknown: {unknown}" if unknown else "")
        )
    return names


def _check_args(
    buf: bytes | bytearray | memoryview,
    base_pos: int,
    min_offset: int,
    max_offset: int,
    max_frames: int | None,
) -> None:
    for name, value in (("base_pos", base_pos), ("min_offset", min_offset), ("max_offset", max_offset)):
        if not 0 <= value <= U64_MAX:
            raise ValueError(f"{name}={value} is outside the u64 range 0..2^64-1")
    if base_pos + memoryview(buf).nbytes > U64_MAX:
        raise ValueError(f"base_pos={base_pos} plus the buffer length overflows a u64 position")
    if max_frames is not None and max_frames < 0:
        raise ValueError(f"max_frames={max_frames} must be None or >= 0")


def _schema_of(names: list[str]) -> pa.Schema:
    return pa.schema([MESSAGE_ARROW_SCHEMA.field(name) for name in names])


def _byte_view(buf: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(buf)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


# ---------------------------------------------------------------------------------------
# Building arrays


def _fast_array(name: str, rows: int, col: tuple[Any, ...]) -> pa.Array:
    """Wrap the decoder's buffers (already in Arrow layout) without copying them."""
    if name == "attributes":
        offsets, n_entries, key_offsets, key_data, value_offsets, value_data = col
        keys = pa.Array.from_buffers(
            pa.string(), n_entries, [None, pa.py_buffer(key_offsets), pa.py_buffer(key_data)], 0
        )
        values = pa.Array.from_buffers(
            pa.string(), n_entries, [None, pa.py_buffer(value_offsets), pa.py_buffer(value_data)], 0
        )
        entries = pa.StructArray.from_arrays(
            [keys, values], fields=[_ATTRIBUTES_TYPE.key_field, _ATTRIBUTES_TYPE.item_field]
        )
        return pa.Array.from_buffers(
            _ATTRIBUTES_TYPE, rows, [None, pa.py_buffer(offsets)], 0, children=[entries]
        )
    buffers, null_count = col
    wrapped = [None if b is None else pa.py_buffer(b) for b in buffers]
    return pa.Array.from_buffers(MESSAGE_ARROW_SCHEMA.field(name).type, rows, wrapped, null_count)


_REFERENCE_GETTERS = {
    "offset": lambda offset, pos, m: offset,
    "request_id": lambda offset, pos, m: m.request_id,
    "producer_id": lambda offset, pos, m: m.msg_id.producer_id,
    "topic_name": lambda offset, pos, m: m.msg_id.topic_name,
    "broker_addr": lambda offset, pos, m: m.msg_id.broker_addr,
    "topic_offset": lambda offset, pos, m: m.msg_id.topic_offset,
    "payload": lambda offset, pos, m: m.payload,
    "publish_time": lambda offset, pos, m: m.publish_time,
    "producer_name": lambda offset, pos, m: m.producer_name,
    "subscription_name": lambda offset, pos, m: m.subscription_name,
    "attributes": lambda offset, pos, m: list(m.attributes.items()),
    "schema_id": lambda offset, pos, m: m.schema_id,
    "schema_version": lambda offset, pos, m: m.schema_version,
    "frame_pos": lambda offset, pos, m: pos,
}


def _reference_batch(names: list[str], rows: list[tuple[int, int, StreamMessage]]) -> pa.RecordBatch:
    arrays = [
        pa.array(
            [_REFERENCE_GETTERS[name](*row) for row in rows],
            type=MESSAGE_ARROW_SCHEMA.field(name).type,
        )
        for name in names
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=_schema_of(names))


# ---------------------------------------------------------------------------------------
# Stops: both decoders describe a stop with these functions, so their results are equal.


def _stopped(
    batch: pa.RecordBatch,
    view: memoryview,
    consumed: int,
    reason: str,
    rel_pos: int | None,
    base_pos: int,
) -> DecodedFrames:
    """An "end", "partial" or "crc" stop at `rel_pos` (relative to the buffer)."""
    if reason == STOP_END:
        return DecodedFrames(batch, consumed, STOP_END, None, None)
    assert rel_pos is not None
    pos = base_pos + rel_pos
    present = len(view) - rel_pos
    if present < FRAME_HEADER_SIZE:
        detail = f"incomplete frame header at byte {pos}: {present} of {FRAME_HEADER_SIZE} bytes"
        return DecodedFrames(batch, consumed, reason, pos, detail)
    offset, length, stored_crc = FRAME_HEADER.unpack_from(view, rel_pos)
    if reason == STOP_PARTIAL:
        detail = (
            f"incomplete frame at byte {pos} (offset {offset}): "
            f"{present} of {FRAME_HEADER_SIZE + length} bytes present"
        )
    else:
        payload_pos = rel_pos + FRAME_HEADER_SIZE
        actual = zlib.crc32(view[payload_pos : payload_pos + length]) & 0xFFFFFFFF
        detail = (
            f"CRC mismatch in the frame at byte {pos} (offset {offset}): header says "
            f"0x{stored_crc:08x}, the {length}-byte payload has 0x{actual:08x}"
        )
    return DecodedFrames(batch, consumed, reason, pos, detail, offset)


def _reference_decode_error(view: memoryview, rel_pos: int) -> str | None:
    """The Python codec's error for the payload of the frame at `rel_pos`, if it has one."""
    offset, length, _crc = FRAME_HEADER.unpack_from(view, rel_pos)
    ref = FrameRef(offset, rel_pos, length)
    try:
        decode_message(view[ref.payload_pos : ref.end_pos])
    except PayloadDecodeError as exc:
        return str(exc)
    return None


def _decode_stop(
    batch: pa.RecordBatch, view: memoryview, consumed: int, rel_pos: int, base_pos: int, error: str
) -> DecodedFrames:
    offset = FRAME_HEADER.unpack_from(view, rel_pos)[0]
    pos = base_pos + rel_pos
    detail = f"payload of the frame at byte {pos} (offset {offset}): {error}"
    return DecodedFrames(batch, consumed, STOP_DECODE, pos, detail, offset)


def _too_large_stop(
    batch: pa.RecordBatch, view: memoryview, rel_pos: int, base_pos: int, limit: int
) -> DecodedFrames:
    """The first in-range frame alone exceeds what one Arrow batch can hold."""
    offset, length, _crc = FRAME_HEADER.unpack_from(view, rel_pos)
    pos = base_pos + rel_pos
    detail = (
        f"payload of the frame at byte {pos} (offset {offset}): {length} bytes do not fit "
        f"in one Arrow batch (at most {limit} bytes)"
    )
    return DecodedFrames(batch, rel_pos, STOP_DECODE, pos, detail, offset)
