"""WAL frames -> Arrow: the C decoder and its pure fallback against the pure-Python reference and the spec.

Frames the decoders must stop at (partial, corrupt, undecodable) are `test_arrow_decode_stops.py`.

Every case that builds a batch runs every decoder and the reference and requires identical
results (`decode_both`), so neither decoder can drift from `danube_core.message`.
"""

from __future__ import annotations

import threading
import zlib

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from danube_core.arrow_decode import (
    MESSAGE_ARROW_SCHEMA,
    decode_frames,
    decode_frames_reference,
    scan_frame_offsets,
)
from danube_core.frames import scan_frames
from danube_core.message import MessageID, StreamMessage, with_offset
from tests.arrow_frames import C_DECODER, DECODERS, decode_both, expected_row, frame, frames, message, raw_frame

U64_MAX = 2**64 - 1

ORDERS_FRAME_HEX = """
2c 01 00 00 00 00 00 00 4f 00 00 00 3f 52 a5 6e
01 fd ef cd ab 89 67 45 23 01 0f 2f 64 65 66 61 75 6c 74 2f 6f 72 64 65 72 73
16 68 74 74 70 3a 2f 2f 31 32 37 2e 30 2e 30 2e 31 3a 36 36 35 30 2f
fb 2c 01 05 68 65 6c 6c 6f fd 7b 68 e5 cf 8b 01 00 00 02 70 31 01 00 01 01 6b 01 76 00 00
"""
SMALLEST_FRAME_HEX = (
    "00 00 00 00 00 00 00 00 11 00 00 00 9e e1 82 a9"
    " 00 07 04 2f 61 2f 62 00 00 00 00 00 01 00 00 00 00"
)
SCHEMA_FIELDS_PAYLOAD_HEX = "02 07 04 2f 61 2f 62 00 01 02 01 02 01 01 70 01 00 00 01 05 01 01"


# ---------------------------------------------------------------------------------------
# The spec's worked examples (bytes taken from the spec, not from our encoder)


def test_spec_1_5_orders_frame() -> None:
    buf = bytes.fromhex(ORDERS_FRAME_HEX)
    assert len(buf) == 95
    result = decode_both(buf)
    assert result.batch.to_pylist() == [
        {
            "offset": 300,
            "request_id": 1,
            "producer_id": 0x0123456789ABCDEF,
            "topic_name": "/default/orders",
            "broker_addr": "http://127.0.0.1:6650/",
            "topic_offset": 300,
            "payload": b"hello",
            "publish_time": 1700000000123,
            "producer_name": "p1",
            "subscription_name": "",
            "attributes": [("k", "v")],
            "schema_id": None,
            "schema_version": None,
            "frame_pos": 0,
        }
    ]
    assert (result.consumed, result.stop_reason, result.stop_pos) == (95, "end", None)


def test_spec_2_7_smallest_frame() -> None:
    row = decode_both(bytes.fromhex(SMALLEST_FRAME_HEX)).batch.to_pylist()[0]
    assert (row["producer_id"], row["topic_name"], row["broker_addr"], row["payload"]) == (
        7,
        "/a/b",
        "",
        b"",
    )
    assert (row["subscription_name"], row["attributes"], row["schema_id"]) == ("", [], None)


def test_spec_2_7_schema_fields() -> None:
    buf = raw_frame(1, bytes.fromhex(SCHEMA_FIELDS_PAYLOAD_HEX))
    row = decode_both(buf).batch.to_pylist()[0]
    assert (row["offset"], row["topic_offset"], row["payload"], row["producer_name"]) == (
        1,
        1,
        b"\x01\x02",
        "p",
    )
    assert (row["schema_id"], row["schema_version"]) == (5, 1)


def test_schema_matches_the_documented_columns() -> None:
    assert MESSAGE_ARROW_SCHEMA.names == list(expected_row(message(), 0))
    assert MESSAGE_ARROW_SCHEMA.field("attributes").type == pa.map_(pa.string(), pa.string())
    nullable = {f.name for f in MESSAGE_ARROW_SCHEMA if f.nullable}
    assert nullable == {"subscription_name", "schema_id", "schema_version"}


# ---------------------------------------------------------------------------------------
# Random messages: fast == reference == what was encoded

u64s = st.one_of(
    st.integers(0, 300),
    st.sampled_from([250, 251, 65535, 65536, 2**32 - 1, 2**32, 2**63, 2**63 + 1, U64_MAX]),
    st.integers(0, U64_MAX),
)
u32s = st.one_of(st.sampled_from([0, 250, 251, 65535, 65536, 2**32 - 1]), st.integers(0, 2**32 - 1))
texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
messages = st.builds(
    lambda rid, pid, topic, broker, payload, pt, producer, sub, attrs, sid, sver: StreamMessage(
        rid, MessageID(pid, topic, broker, 0), payload, pt, producer, sub, attrs, sid, sver
    ),
    u64s,
    u64s,
    texts,
    texts,
    st.one_of(
        st.binary(max_size=300),
        # large payloads (fc length marker), cheap to generate
        st.tuples(st.integers(65_530, 70_000), st.integers(0, 255)).map(lambda t: bytes([t[1]]) * t[0]),
    ),
    u64s,
    texts,
    st.none() | texts,
    st.dictionaries(texts, texts, max_size=12),
    st.none() | u64s,
    st.none() | u32s,
)


@st.composite
def frame_buffers(draw) -> tuple[bytes, list[StreamMessage], list[int]]:
    """Frames of random messages at random (not necessarily increasing) offsets."""
    msgs = draw(st.lists(messages, max_size=8))
    offsets = draw(st.lists(u64s, min_size=len(msgs), max_size=len(msgs)))
    stamped = [with_offset(m, o) for m, o in zip(msgs, offsets)]
    encoded = [frame(m) for m in stamped]
    positions = [sum(len(f) for f in encoded[:i]) for i in range(len(encoded))]
    return b"".join(encoded), stamped, positions


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frame_buffers(), st.integers(0, 2**40))
def test_random_messages_decode_as_encoded(data, base_pos: int) -> None:
    buf, msgs, positions = data
    result = decode_both(buf, base_pos=base_pos)
    assert result.batch.to_pylist() == [
        expected_row(m, base_pos + p) for m, p in zip(msgs, positions)
    ]
    assert (result.consumed, result.stop_reason) == (len(buf), "end")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    frame_buffers(),
    u64s,
    u64s,
    st.none() | st.integers(0, 10),
    st.none() | st.lists(st.sampled_from(MESSAGE_ARROW_SCHEMA.names), min_size=1, unique=True),
    st.integers(0, 40),
)
def test_random_filters_and_cuts_agree(data, lo, hi, max_frames, columns, cut) -> None:
    buf, _msgs, _positions = data
    buf = buf[: max(0, len(buf) - cut)]  # often leaves a partial trailing frame
    decode_both(buf, min_offset=lo, max_offset=hi, max_frames=max_frames, columns=columns)


# bytes at the edges of the UTF-8 rules, so that invalid multi-byte sequences are common
utf8_edge_bytes = st.lists(
    st.sampled_from([0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF,
                     0xE0, 0xE1, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF4, 0xF5, 0xFF]),
    max_size=12,
).map(bytes)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(st.binary(max_size=12), utf8_edge_bytes, texts.map(str.encode)),
    st.sampled_from(["topic", "key", "value", "producer"]),
)
def test_utf8_validation_matches_python(raw: bytes, where: str) -> None:
    """Any byte string: both decoders accept exactly what Python's strict UTF-8 accepts."""

    def string(b: bytes) -> bytes:
        return bytes([len(b)]) + b

    topic = raw if where == "topic" else b"/a/b"
    producer = raw if where == "producer" else b"p"
    key, value = (raw if where == "key" else b"k"), (raw if where == "value" else b"v")
    payload = (
        b"\x00\x07" + string(topic) + string(b"") + b"\x00\x00\x00" + string(producer)
        + b"\x01\x00" + b"\x01" + string(key) + string(value) + b"\x00\x00"
    )
    result = decode_both(raw_frame(0, payload))
    try:
        raw.decode("utf-8")
        valid = True
    except UnicodeDecodeError:
        valid = False
    assert result.stop_reason == ("end" if valid else "decode")


# ---------------------------------------------------------------------------------------
# Filtering, columns, limits


def test_offset_range_is_inclusive_and_skipped_frames_are_consumed() -> None:
    buf = frames(10)
    result = decode_both(buf, min_offset=3, max_offset=6)
    assert result.batch.column("offset").to_pylist() == [3, 4, 5, 6]
    assert (result.consumed, result.stop_reason) == (len(buf), "end")


def test_skipped_frames_are_crc_checked_but_not_decoded() -> None:
    garbage = raw_frame(0, b"\xff\xff\xff")  # good CRC, undecodable payload
    good = frame(message(1))
    result = decode_both(garbage + good, min_offset=1)
    assert (result.batch.num_rows, result.stop_reason) == (1, "end")
    corrupt = bytearray(garbage)
    corrupt[-1] ^= 0x01
    result = decode_both(bytes(corrupt) + good, min_offset=1)
    assert (result.batch.num_rows, result.stop_reason, result.stop_pos) == (0, "crc", 0)


def test_columns_subset_in_requested_order() -> None:
    buf = frames(5)
    full = decode_both(buf)
    subset = decode_both(buf, columns=["payload", "offset", "attributes", "schema_version"])
    assert subset.batch.schema.names == ["payload", "offset", "attributes", "schema_version"]
    for name in subset.batch.schema.names:
        assert subset.batch.column(name).equals(full.batch.column(name))


@pytest.mark.parametrize(
    "columns", [[], ["offset", "offset"], ["offset", "nope"], "offset"], ids=repr
)
def test_bad_columns_are_rejected(columns) -> None:
    with pytest.raises(ValueError, match="columns"):
        decode_frames(frames(1), columns=columns)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base_pos": -1},
        {"base_pos": U64_MAX - 10},  # frame positions would overflow a u64
        {"min_offset": -1},
        {"max_offset": 2**64},
        {"max_frames": -1},
    ],
    ids=repr,
)
def test_bad_arguments_are_rejected(kwargs) -> None:
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        decode_frames(frames(1), **kwargs)


def test_max_frames_stops_after_that_many_rows() -> None:
    buf = frames(10)
    one = len(frame(message(0)))
    result = decode_both(buf, max_frames=3)
    assert (result.batch.num_rows, result.consumed, result.stop_reason) == (3, 3 * one, "end")
    result = decode_both(buf, max_frames=0)
    assert (result.batch.num_rows, result.consumed, result.stop_reason) == (0, 0, "end")
    # reaching the limit on the last whole frame reports "end", not the partial tail after it
    result = decode_both(buf + b"\x00" * 5, max_frames=10)
    assert (result.consumed, result.stop_reason) == (len(buf), "end")


def test_batch_byte_limit_ends_the_batch_before_int32_offsets_overflow() -> None:
    buf = frames(10)
    payload_len = len(frame(message(0))) - 16
    result = decode_both(buf, _max_batch_bytes=3 * payload_len + 5)
    assert (result.batch.num_rows, result.stop_reason, result.stop_pos) == (3, "end", None)
    assert result.consumed == 3 * (payload_len + 16)


def test_frame_larger_than_a_batch_is_a_decode_stop() -> None:
    result = decode_both(frames(2), base_pos=7, _max_batch_bytes=10)
    assert (result.batch.num_rows, result.consumed, result.stop_reason) == (0, 0, "decode")
    assert (result.stop_pos, result.stop_offset) == (7, 0)
    assert "do not fit in one Arrow batch" in result.stop_detail


# ---------------------------------------------------------------------------------------
# Inputs, outputs and scale


def test_memoryview_slices_and_bytearrays_decode_like_bytes() -> None:
    buf = frames(6)
    one = len(frame(message(0)))
    window = memoryview(bytearray(buf))[2 * one : 5 * one]
    from_view = decode_both(window, base_pos=2 * one)
    from_bytes = decode_both(bytes(window), base_pos=2 * one)
    assert from_view.batch.equals(from_bytes.batch)
    assert from_view.batch.column("frame_pos").to_pylist() == [2 * one, 3 * one, 4 * one]


@pytest.mark.parametrize("decoder", DECODERS, ids=lambda d: d.__name__)
def test_batch_owns_its_memory(decoder) -> None:
    source = bytearray(frames(3))
    batch = decode_frames(source, _decoder=decoder).batch
    expected = batch.to_pylist()
    source[:] = b"\x00" * len(source)
    del source
    assert batch.to_pylist() == expected


@pytest.mark.parametrize("decoder", DECODERS, ids=lambda d: d.__name__)
def test_large_buffers_grow_correctly(decoder) -> None:
    """Enough rows and bytes to move every column buffer through its growth paths."""
    big = frame(message(0, payload=bytes(range(256)) * 3000, attributes={f"k{i}": "v" * i for i in range(50)}))
    small = frame(message(1))
    count = 150_000
    buf = big * 3 + small * count
    result = decode_frames(buf, _decoder=decoder)
    result.batch.validate(full=True)
    assert (result.batch.num_rows, result.consumed, result.stop_reason) == (count + 3, len(buf), "end")
    tail = result.batch.slice(3)
    assert pc.all(pc.equal(tail.column("offset"), 1)).as_py()
    assert pc.all(pc.equal(tail.column("payload"), b"x" * 100)).as_py()
    assert result.batch.column("payload")[2].as_py() == bytes(range(256)) * 3000
    assert len(result.batch.column("attributes")[1].as_py()) == 50
    assert result.batch.column("frame_pos")[-1].as_py() == len(buf) - len(small)
    ref = decode_frames_reference(big * 3 + small * 3)
    assert decode_frames(big * 3 + small * 3, _decoder=decoder).batch.equals(ref.batch)


@pytest.mark.parametrize("decoder", DECODERS, ids=lambda d: d.__name__)
def test_concurrent_decodes_are_safe(decoder) -> None:
    buf = frames(2000)
    expected = decode_frames(buf, _decoder=decoder).batch
    results: list[pa.RecordBatch] = []

    def work() -> None:
        results.append(decode_frames(buf, _decoder=decoder).batch)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 4 and all(batch.equals(expected) for batch in results)


# ---------------------------------------------------------------------------------------
# Header-only scan and the CRC itself


@pytest.mark.parametrize("decoder", DECODERS, ids=lambda d: d.__name__)
def test_scan_frame_offsets_matches_scan_frames(decoder) -> None:
    buf = frames(5, start=2**63) + frame(message(3))
    damaged = bytearray(buf + frames(1))
    damaged[-1] ^= 0x01
    offsets, positions, consumed, stop_reason = scan_frame_offsets(bytes(damaged), base_pos=9, _decoder=decoder)
    expected = scan_frames(bytes(damaged))
    assert offsets.tolist() == [ref.offset for ref in expected.frames]
    assert positions.tolist() == [9 + ref.frame_pos for ref in expected.frames]
    assert (consumed, stop_reason) == (expected.safe_end, "crc") == (len(buf), "crc")
    assert str(offsets.dtype) == "uint64"


@pytest.mark.parametrize("decoder", DECODERS, ids=lambda d: d.__name__)
def test_scan_frame_offsets_partial_and_empty(decoder) -> None:
    buf = frames(2)
    assert scan_frame_offsets(buf + b"\x01", _decoder=decoder)[2:] == (len(buf), "partial")
    offsets, positions, consumed, stop_reason = scan_frame_offsets(b"", _decoder=decoder)
    assert (len(offsets), len(positions), consumed, stop_reason) == (0, 0, 0, "end")


@pytest.mark.skipif(C_DECODER is None, reason="the C decoder is not built")
@pytest.mark.parametrize("portable", [False, True])
def test_crc_matches_zlib_for_every_length(portable: bool) -> None:
    data = bytes((i * 131 + 7) & 0xFF for i in range(4200))
    for length in list(range(0, 300)) + [1000, 4096, 4200]:
        for start in (0, 3):
            chunk = data[start : start + length]
            assert C_DECODER.crc32(chunk, portable) == zlib.crc32(chunk), (length, start)
    assert C_DECODER.crc32(b"123456789", portable) == 0xCBF43926
