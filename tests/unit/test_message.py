"""StreamMessage payloads: the spec's worked examples byte for byte, plus round trips."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings, strategies as st

from danube_core.errors import PayloadDecodeError
from danube_core.message import MessageID, StreamMessage, decode_message, encode_message, with_offset

ORDERS_HEX = """
01 fd ef cd ab 89 67 45 23 01 0f 2f 64 65 66 61 75 6c 74 2f 6f 72 64 65 72 73
16 68 74 74 70 3a 2f 2f 31 32 37 2e 30 2e 30 2e 31 3a 36 36 35 30 2f
fb 2c 01 05 68 65 6c 6c 6f fd 7b 68 e5 cf 8b 01 00 00 02 70 31 01 00 01 01 6b 01 76 00 00
"""


def orders_message() -> StreamMessage:
    return StreamMessage(
        request_id=1,
        msg_id=MessageID(0x0123456789ABCDEF, "/default/orders", "http://127.0.0.1:6650/", 300),
        payload=b"hello",
        publish_time=1700000000123,
        producer_name="p1",
        subscription_name="",
        attributes={"k": "v"},
    )


def test_spec_2_7_orders_message() -> None:
    expected = bytes.fromhex(ORDERS_HEX)
    assert len(expected) == 79
    assert encode_message(orders_message()) == expected
    assert decode_message(expected) == orders_message()


def test_spec_2_7_smallest_message() -> None:
    msg = StreamMessage(0, MessageID(7, "/a/b", "", 0), b"", 0, "")
    expected = bytes.fromhex("00 07 04 2f 61 2f 62 00 00 00 00 00 01 00 00 00 00")
    assert encode_message(msg) == expected
    assert decode_message(expected) == msg


def test_spec_2_7_schema_fields_message() -> None:
    msg = StreamMessage(2, MessageID(7, "/a/b", "", 1), b"\x01\x02", 1, "p", "", {}, 5, 1)
    expected = bytes.fromhex("02 07 04 2f 61 2f 62 00 01 02 01 02 01 01 70 01 00 00 01 05 01 01")
    assert encode_message(msg) == expected
    assert decode_message(expected) == msg


def test_subscription_name_none_is_representable() -> None:
    msg = dataclasses.replace(orders_message(), subscription_name=None)
    assert decode_message(encode_message(msg)).subscription_name is None


def test_trailing_bytes_ignored_and_pos_respected() -> None:
    encoded = encode_message(orders_message())
    assert decode_message(b"junk" + encoded + b"\xff\xff", pos=4) == orders_message()


def test_broker_written_unsorted_attributes_round_trip_byte_identical() -> None:
    # As the broker's HashMap would write them: an arbitrary, non-sorted order.
    msg = dataclasses.replace(orders_message(), attributes={"zeta": "1", "alpha": "2", "mid": "3"})
    raw = encode_message(msg)
    decoded = decode_message(raw)
    assert list(decoded.attributes) == ["zeta", "alpha", "mid"]
    assert encode_message(decoded) == raw


def test_with_offset_stamps_copy_only() -> None:
    original = orders_message()
    stamped = with_offset(original, 2**64 - 1)
    assert stamped.msg_id.topic_offset == 2**64 - 1
    assert original.msg_id.topic_offset == 300
    assert decode_message(encode_message(stamped)).msg_id.topic_offset == 2**64 - 1


@pytest.mark.parametrize("cut", [1, 10, 40, 60, 78])
def test_truncated_payload_is_refused(cut: int) -> None:
    with pytest.raises(PayloadDecodeError, match=r"at byte \d+"):
        decode_message(bytes.fromhex(ORDERS_HEX)[:cut])


def test_u64_marker_in_schema_version_is_refused() -> None:
    good = bytes.fromhex("02 07 04 2f 61 2f 62 00 01 02 01 02 01 01 70 01 00 00 01 05 01 01")
    bad = good[:-1] + bytes.fromhex("fd 01 00 00 00 00 00 00 00")
    with pytest.raises(PayloadDecodeError, match=r"byte 21 \(schema_version\)"):
        decode_message(bad)


def test_invalid_subscription_option_tag() -> None:
    raw = bytearray(bytes.fromhex(ORDERS_HEX))
    assert raw[70:72] == b"\x01\x00"  # subscription_name = Some("")
    raw[70] = 0x07
    with pytest.raises(PayloadDecodeError, match=r"byte 70 \(subscription_name\).*tag 0x07"):
        decode_message(bytes(raw))


def test_invalid_utf8_in_topic_name() -> None:
    raw = bytearray(bytes.fromhex(ORDERS_HEX))
    raw[11] = 0xFF  # the '/' of "/default/orders"
    with pytest.raises(PayloadDecodeError, match=r"msg_id.topic_name.*invalid UTF-8"):
        decode_message(bytes(raw))


def test_schema_version_above_u32_refused_on_encode() -> None:
    with pytest.raises(ValueError, match="schema_version"):
        encode_message(dataclasses.replace(orders_message(), schema_version=2**32))


U64 = st.integers(min_value=0, max_value=2**64 - 1)
HIGH_U64 = st.integers(min_value=2**63, max_value=2**64 - 1)
TEXT = st.text(max_size=40)


@st.composite
def messages(draw: st.DrawFn) -> StreamMessage:
    payload = draw(
        st.one_of(st.just(b""), st.just(bytes(range(256)) * 4096), st.binary(max_size=600))
    )
    return StreamMessage(
        request_id=draw(st.one_of(U64, HIGH_U64)),
        msg_id=MessageID(draw(st.one_of(U64, HIGH_U64)), draw(TEXT), draw(TEXT), draw(U64)),
        payload=payload,
        publish_time=draw(U64),
        producer_name=draw(TEXT),
        subscription_name=draw(st.one_of(st.none(), TEXT)),
        attributes=draw(st.dictionaries(TEXT, TEXT, max_size=60)),
        schema_id=draw(st.one_of(st.none(), U64)),
        schema_version=draw(st.one_of(st.none(), st.integers(0, 2**32 - 1))),
    )


@settings(max_examples=150, deadline=None)
@given(messages())
def test_message_round_trip(msg: StreamMessage) -> None:
    raw = encode_message(msg)
    decoded = decode_message(raw)
    assert decoded == msg
    assert list(decoded.attributes) == list(msg.attributes)
    assert encode_message(decoded) == raw


def test_one_mib_payload_round_trip() -> None:
    msg = dataclasses.replace(orders_message(), payload=bytes(range(256)) * 4096)
    raw = encode_message(msg)
    assert raw[raw.index(b"\xfc"):][:5] == bytes.fromhex("fc 00 00 10 00")
    assert decode_message(raw).payload == msg.payload
