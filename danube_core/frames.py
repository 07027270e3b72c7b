"""WAL frame header and the safe-prefix scanner (spec §1).

A frame is `offset u64 LE | len u32 LE | crc u32 LE | payload`; the CRC (zlib.crc32, IEEE)
covers the payload only. WAL files and cloud objects are frames back to back with no file
header. `scan_frames` finds the "safe prefix" every broker component relies on: whole frames
whose CRC matches, stopping at the first partial or corrupt one (§1.4).
"""

from __future__ import annotations

import logging
import struct
import zlib
from dataclasses import dataclass
from typing import Iterator

from danube_core.errors import CorruptFrameError, PayloadDecodeError
from danube_core.message import StreamMessage, decode_message

logger = logging.getLogger(__name__)

FRAME_HEADER = struct.Struct("<QII")
FRAME_HEADER_SIZE = 16

STOP_END = "end"
STOP_PARTIAL = "partial"
STOP_CRC = "crc"


def encode_frame(offset: int, payload: bytes) -> bytes:
    """One frame; the payload must already carry `offset` in msg_id.topic_offset (§2.6)."""
    return FRAME_HEADER.pack(offset, len(payload), zlib.crc32(payload) & 0xFFFFFFFF) + payload


@dataclass(frozen=True)
class FrameRef:
    """Location of one CRC-checked frame in a buffer; its payload is at `frame_pos + 16`."""

    offset: int
    frame_pos: int
    payload_len: int

    @property
    def payload_pos(self) -> int:
        return self.frame_pos + FRAME_HEADER_SIZE

    @property
    def end_pos(self) -> int:
        """Byte position just past this frame (the next frame's header)."""
        return self.frame_pos + FRAME_HEADER_SIZE + self.payload_len


@dataclass
class FrameScan:
    """Result of a scan: the good frames and where the safe prefix ends.

    `stop_reason` is "end" (buffer consumed exactly, or `max_frames` reached), "partial"
    (an incomplete trailing frame: wait for more bytes) or "crc" (the frame at `stop_pos`
    fails its CRC). `safe_end` is the byte position just past the last good frame.
    """

    frames: list[FrameRef]
    safe_end: int
    stop_reason: str
    stop_pos: int | None


def scan_frames(
    buf: bytes | bytearray | memoryview, start: int = 0, max_frames: int | None = None
) -> FrameScan:
    """Walk frames from `start` (a frame boundary) and return the CRC-checked safe prefix.

    A damaged `len` looks like a partial frame, exactly as in the broker: the scan waits.
    """
    view = memoryview(buf).cast("B")  # CRC over memoryview slices copies nothing
    total = len(view)
    pos = start
    frames: list[FrameRef] = []
    while max_frames is None or len(frames) < max_frames:
        if total - pos < FRAME_HEADER_SIZE:
            reason = STOP_END if pos == total else STOP_PARTIAL
            return FrameScan(frames, pos, reason, None if reason == STOP_END else pos)
        offset, length, crc = FRAME_HEADER.unpack_from(view, pos)
        payload_pos = pos + FRAME_HEADER_SIZE
        if total - payload_pos < length:
            return FrameScan(frames, pos, STOP_PARTIAL, pos)
        if zlib.crc32(view[payload_pos : payload_pos + length]) & 0xFFFFFFFF != crc:
            return FrameScan(frames, pos, STOP_CRC, pos)
        frames.append(FrameRef(offset, pos, length))
        pos = payload_pos + length
    return FrameScan(frames, pos, STOP_END, None)


def iter_messages(
    buf: bytes | bytearray | memoryview, source: str, start: int = 0
) -> Iterator[tuple[FrameRef, StreamMessage]]:
    """Decode every frame of a cloud object strictly (as the broker's cloud reader does).

    A CRC mismatch or an undecodable payload raises CorruptFrameError naming `source`; a
    partial trailing frame is dropped quietly (logged).
    """
    view = memoryview(buf).cast("B")
    scan = scan_frames(view, start)
    for ref in scan.frames:
        try:
            # Bound the decoder to this frame so a short payload cannot read the next frame.
            msg = decode_message(view[ref.payload_pos : ref.end_pos])
        except PayloadDecodeError as exc:
            raise CorruptFrameError(source, ref.offset, ref.frame_pos, str(exc)) from exc
        yield ref, msg
    if scan.stop_reason == STOP_CRC:
        assert scan.stop_pos is not None  # a scan that stopped says where
        offset = FRAME_HEADER.unpack_from(view, scan.stop_pos)[0]
        raise CorruptFrameError(source, offset, scan.stop_pos, "CRC mismatch")
    if scan.stop_reason == STOP_PARTIAL:
        logger.warning(
            "dropping partial trailing frame in %s at byte %s", source, scan.stop_pos
        )
