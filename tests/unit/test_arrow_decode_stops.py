"""WAL frames -> Arrow where the decoders must stop: partial, corrupt and undecodable frames.

Every case runs both decoders and requires identical results (`tests.arrow_frames.decode_both`).
"""

from __future__ import annotations

import struct

import pytest

from danube_core.arrow_decode import MESSAGE_ARROW_SCHEMA, decode_frames
from danube_core.errors import CorruptFrameError
from danube_core.message import encode_message
from tests.arrow_frames import C_DECODER, decode_both, frame, frames, message, raw_frame

U64_MAX = 2**64 - 1


# ---------------------------------------------------------------------------------------
# Partial, corrupt and undecodable frames


def test_empty_buffer() -> None:
    result = decode_both(b"")
    assert result.batch.num_rows == 0
    assert result.batch.schema == MESSAGE_ARROW_SCHEMA
    assert (result.consumed, result.stop_reason, result.stop_pos) == (0, "end", None)


def test_every_truncation_point_is_a_partial_stop() -> None:
    first, second = frame(message(0)), frame(message(1, payload=b"\xfb" * 300))
    buf = first + second
    for cut in range(len(buf) + 1):
        result = decode_both(buf[:cut], base_pos=1000)
        whole = 0 if cut < len(first) else 1 if cut < len(buf) else 2
        boundary = [0, len(first), len(buf)][whole]
        assert result.batch.num_rows == whole
        assert result.consumed == boundary
        if cut == boundary:
            assert (result.stop_reason, result.stop_pos) == ("end", None)
        else:
            assert (result.stop_reason, result.stop_pos) == ("partial", 1000 + boundary)
            assert f"{cut - boundary} of" in result.stop_detail


def test_len_larger_than_the_buffer_is_partial() -> None:
    good = frame(message(0))
    bogus = struct.pack("<QII", 1, 10_000_000, 0) + b"\x00" * 50
    result = decode_both(good + bogus)
    assert (result.batch.num_rows, result.stop_reason, result.stop_pos) == (1, "partial", len(good))
    assert result.stop_offset == 1
    result.raise_if_corrupt("wal.log")  # a partial frame is not corruption


def test_every_flipped_payload_or_crc_byte_stops_at_that_frame() -> None:
    first, second = frame(message(0)), frame(message(1))
    for index in range(12, len(second)):  # crc field and payload
        damaged = bytearray(second)
        damaged[index] ^= 0x40
        result = decode_both(first + bytes(damaged) + frame(message(2)), base_pos=5)
        assert (result.batch.num_rows, result.consumed) == (1, len(first))
        assert (result.stop_reason, result.stop_pos, result.stop_offset) == ("crc", 5 + len(first), 1)
        assert "CRC mismatch" in result.stop_detail


def test_raise_if_corrupt_names_source_offset_and_position() -> None:
    damaged = bytearray(frames(3))
    damaged[-1] ^= 0x01
    result = decode_frames(bytes(damaged), base_pos=100)
    with pytest.raises(CorruptFrameError) as info:
        result.raise_if_corrupt("s3://bucket/data-2-1.dnb1")
    assert (info.value.source, info.value.offset) == ("s3://bucket/data-2-1.dnb1", 2)
    assert info.value.byte_pos == 100 + 2 * len(frame(message(0)))


def payload_bytes(
    head: bytes = b"\x00\x07",  # request_id, producer_id
    topic: bytes = b"\x04/a/b",
    tail: bytes = b"\x00\x00\x00\x00\x01p",  # broker_addr, topic_offset, payload, publish_time, producer
    sub: bytes = b"\x01\x00",
    attrs: bytes = b"\x01\x01k\x01v",
    schema_id: bytes = b"\x00",
    schema_version: bytes = b"\x00",
) -> bytes:
    """A valid payload by default; each test breaks exactly one field, so a decoder that
    wrongly accepted the defect would return a row instead of stopping."""
    return head + topic + tail + sub + attrs + schema_id + schema_version


def test_payload_bytes_default_is_valid() -> None:
    assert decode_both(raw_frame(0, payload_bytes())).batch.num_rows == 1


PAYLOAD_DEFECTS = {
    "request_id ff marker": (payload_bytes(head=b"\xff\x07"), "request_id"),
    "producer_id u128 marker": (payload_bytes(head=b"\x00\xfe" + b"\x00" * 16), "msg_id.producer_id"),
    "topic_name longer than the payload": (payload_bytes(topic=b"\x40/a/b"), "msg_id.topic_name"),
    "payload length past the end": (b"\x00\x07\x04/a/b\x00\x00\xfb\x00\x10", "payload"),
    "topic_name overlong utf-8": (payload_bytes(topic=b"\x02\xc0\x80"), "msg_id.topic_name"),
    "topic_name surrogate": (payload_bytes(topic=b"\x03\xed\xa0\x80"), "msg_id.topic_name"),
    "topic_name above U+10FFFF": (payload_bytes(topic=b"\x04\xf4\x90\x80\x80"), "msg_id.topic_name"),
    "topic_name cut multi-byte char": (payload_bytes(topic=b"\x02a\xe2"), "msg_id.topic_name"),
    "subscription option tag 02": (payload_bytes(sub=b"\x02\x00"), "subscription_name"),
    "attributes key invalid utf-8": (payload_bytes(attrs=b"\x01\x01\x80\x01v"), "attributes"),
    "attributes value invalid utf-8": (payload_bytes(attrs=b"\x01\x01k\x01\xff"), "attributes"),
    "schema_id option tag 05": (payload_bytes(schema_id=b"\x05"), "schema_id"),
    "schema_version fd marker": (payload_bytes(schema_version=b"\x01\xfd" + b"\x01" * 8), "schema_version"),
    "truncated before schema_version": (payload_bytes(schema_version=b""), "schema_version"),
}


@pytest.mark.parametrize("defect", sorted(PAYLOAD_DEFECTS))
def test_payload_defects_are_decode_stops(defect: str) -> None:
    payload, field = PAYLOAD_DEFECTS[defect]
    good = frame(message(0))
    buf = good + raw_frame(9, payload) + frame(message(10))
    result = decode_both(buf, base_pos=3)
    assert (result.batch.num_rows, result.consumed) == (1, len(good))
    assert (result.stop_reason, result.stop_pos, result.stop_offset) == ("decode", 3 + len(good), 9)
    assert field in result.stop_detail
    if C_DECODER is not None:  # the C decoder's own diagnosis (kept for the case where the decoders disagree)
        c_field = C_DECODER.decode(buf, 0, 0, U64_MAX, -1, 1, 2**31 - 1)[4]
        assert c_field.startswith(field)
    with pytest.raises(CorruptFrameError, match=field):
        result.raise_if_corrupt("object.dnb1")


def test_longer_varint_forms_and_trailing_payload_bytes_are_accepted() -> None:
    payload = b"\xfb\x05\x00" + encode_message(message(0))[1:] + b"trailing junk"
    row = decode_both(raw_frame(0, payload)).batch.to_pylist()[0]
    assert row["request_id"] == 5


def test_duplicate_attribute_keys_behave_like_a_dict() -> None:
    head = encode_message(message(0, attributes={}))[:-3]  # up to the attribute count
    attrs = b"\x03" + b"\x01a\x011" + b"\x01b\x012" + b"\x01a\x013"
    row = decode_both(raw_frame(0, head + attrs + b"\x00\x00")).batch.to_pylist()[0]
    assert row["attributes"] == [("a", "3"), ("b", "2")]


def test_many_attributes_with_duplicates_behave_like_a_dict() -> None:
    """Beyond a handful of keys the C decoder finds duplicates by hashing; same semantics."""
    entries = [(f"key-{i % 700}", f"value-{i}") for i in range(3000)] + [("", "empty")] * 3
    expected = dict(entries)
    head = encode_message(message(0, attributes={}))[:-3]
    attrs = b"\xfb" + struct.pack("<H", len(entries)) + b"".join(
        bytes([len(k)]) + k.encode() + bytes([len(v)]) + v.encode() for k, v in entries
    )
    row = decode_both(raw_frame(0, head + attrs + b"\x00\x00")).batch.to_pylist()[0]
    assert row["attributes"] == list(expected.items())
