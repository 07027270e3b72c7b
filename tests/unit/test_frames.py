"""WAL frames (spec §1): header bytes, safe-prefix scanning and strict object decoding."""

from __future__ import annotations

import pickle
import zlib

import pytest

from danube_core.errors import CorruptFrameError
from danube_core.frames import FRAME_HEADER, FRAME_HEADER_SIZE, FrameRef, encode_frame, iter_messages, scan_frames
from danube_core.message import MessageID, StreamMessage, encode_message, with_offset

SMALLEST_PAYLOAD = bytes.fromhex("00 07 04 2f 61 2f 62 00 00 00 00 00 01 00 00 00 00")


def message(offset: int, payload: bytes = b"hello") -> StreamMessage:
    base = StreamMessage(1, MessageID(7, "/default/orders", "http://127.0.0.1:6650/", 0), payload, 5, "p1")
    return with_offset(base, offset)


def frames_for(offsets: range) -> bytes:
    return b"".join(encode_frame(o, encode_message(message(o))) for o in offsets)


def test_crc_is_ieee_crc32() -> None:
    assert zlib.crc32(b"123456789") == 0xCBF43926


def test_spec_1_5_frame_header() -> None:
    payload = encode_message(
        StreamMessage(1, MessageID(0x0123456789ABCDEF, "/default/orders", "http://127.0.0.1:6650/", 300),
                      b"hello", 1700000000123, "p1", "", {"k": "v"})
    )
    frame = encode_frame(300, payload)
    assert frame[:FRAME_HEADER_SIZE] == bytes.fromhex("2c 01 00 00 00 00 00 00 4f 00 00 00 3f 52 a5 6e")
    assert len(frame) == 95 and frame[16:] == payload


def test_spec_2_7_smallest_frame() -> None:
    frame = encode_frame(0, SMALLEST_PAYLOAD)
    assert frame[:16] == bytes.fromhex("00 00 00 00 00 00 00 00 11 00 00 00 9e e1 82 a9")


def test_scan_whole_buffer() -> None:
    buf = frames_for(range(10, 13))
    scan = scan_frames(buf)
    assert [f.offset for f in scan.frames] == [10, 11, 12]
    assert scan.stop_reason == "end" and scan.stop_pos is None and scan.safe_end == len(buf)
    assert scan.frames[1].frame_pos == scan.frames[0].end_pos
    assert scan.frames[0].payload_len == len(buf) // 3 - FRAME_HEADER_SIZE


def test_scan_empty_buffer() -> None:
    scan = scan_frames(b"")
    assert scan.frames == [] and scan.safe_end == 0 and scan.stop_reason == "end"


@pytest.mark.parametrize("extra", [1, 15, 16, 20])
def test_partial_trailing_frame_waits(extra: int) -> None:
    good = frames_for(range(2))
    buf = good + frames_for(range(2, 3))[:extra]
    scan = scan_frames(buf)
    assert [f.offset for f in scan.frames] == [0, 1]
    assert scan.stop_reason == "partial" and scan.stop_pos == len(good) and scan.safe_end == len(good)


def test_len_larger_than_buffer_is_partial() -> None:
    good = frames_for(range(1))
    huge = FRAME_HEADER.pack(1, 0xFFFFFFF0, 0) + b"x" * 100
    scan = scan_frames(good + huge)
    assert scan.stop_reason == "partial" and scan.stop_pos == len(good)
    assert len(scan.frames) == 1


def test_flipped_payload_byte_stops_at_crc() -> None:
    buf = bytearray(frames_for(range(3)))
    second = scan_frames(bytes(buf)).frames[1]
    buf[second.payload_pos + 5] ^= 0x01
    scan = scan_frames(bytes(buf))
    assert [f.offset for f in scan.frames] == [0]
    assert scan.stop_reason == "crc" and scan.stop_pos == second.frame_pos == scan.safe_end


def test_scan_from_start_and_max_frames() -> None:
    buf = frames_for(range(5))
    first = scan_frames(buf, max_frames=2)
    assert [f.offset for f in first.frames] == [0, 1] and first.stop_reason == "end"
    rest = scan_frames(buf, start=first.safe_end)
    assert [f.offset for f in rest.frames] == [2, 3, 4]
    assert rest.frames[0] == FrameRef(2, first.safe_end, rest.frames[0].payload_len)


def test_scan_accepts_bytearray_and_memoryview() -> None:
    buf = frames_for(range(2))
    assert len(scan_frames(bytearray(buf)).frames) == 2
    assert len(scan_frames(memoryview(buf)).frames) == 2


def test_iter_messages_decodes_and_drops_partial_tail() -> None:
    buf = frames_for(range(3)) + frames_for(range(3, 4))[:20]
    decoded = list(iter_messages(buf, "objects/data-0-1.dnb1"))
    assert [(ref.offset, msg.msg_id.topic_offset) for ref, msg in decoded] == [(0, 0), (1, 1), (2, 2)]


def test_iter_messages_crc_mismatch_is_hard_error() -> None:
    buf = bytearray(frames_for(range(3)))
    bad = scan_frames(bytes(buf)).frames[2]
    buf[bad.end_pos - 1] ^= 0xFF
    seen = []
    with pytest.raises(CorruptFrameError) as info:
        for ref, _ in iter_messages(bytes(buf), "s3://b/data-0-1.dnb1"):
            seen.append(ref.offset)
    assert seen == [0, 1]
    err = info.value
    assert (err.source, err.offset, err.byte_pos) == ("s3://b/data-0-1.dnb1", 2, bad.frame_pos)
    assert f"at byte {bad.frame_pos}" in str(err) and "offset 2" in str(err)
    assert "s3://b/data-0-1.dnb1" in str(err)


def test_iter_messages_undecodable_payload_is_corrupt_frame() -> None:
    garbage = b"\xff" * 8
    buf = frames_for(range(1)) + encode_frame(1, garbage)
    with pytest.raises(CorruptFrameError, match=r"offset 1.*0xff") as info:
        list(iter_messages(buf, "wal.log"))
    assert info.value.__cause__ is not None


def test_iter_messages_short_payload_does_not_read_next_frame() -> None:
    # A payload cut short must fail inside its own frame, not borrow the next frame's bytes.
    truncated = SMALLEST_PAYLOAD[:-1]
    buf = encode_frame(0, truncated) + encode_frame(1, SMALLEST_PAYLOAD)
    with pytest.raises(CorruptFrameError, match="offset 0"):
        list(iter_messages(buf, "wal.log"))


def test_corrupt_frame_error_survives_pickling() -> None:
    # Raised on Spark executors and shipped to the driver.
    err = pickle.loads(pickle.dumps(CorruptFrameError("wal.log", None, 95, "CRC mismatch")))
    assert (err.source, err.offset, err.byte_pos, err.reason) == ("wal.log", None, 95, "CRC mismatch")
    assert "unknown offset" in str(err) and err.retriable is False
