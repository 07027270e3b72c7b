"""bincode 2 standard() primitives against the spec §2.2 tables."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from danube_core.bincode import BincodeReader, BincodeWriter, encode_varint
from danube_core.errors import PayloadDecodeError

VARINT_EXAMPLES = [
    (0, "00"),
    (250, "fa"),
    (251, "fb fb 00"),
    (300, "fb 2c 01"),
    (65535, "fb ff ff"),
    (65536, "fc 00 00 01 00"),
    (2**32 - 1, "fc ff ff ff ff"),
    (2**32, "fd 00 00 00 00 01 00 00 00"),
    (2**64 - 1, "fd ff ff ff ff ff ff ff ff"),
]


@pytest.mark.parametrize("value,hex_bytes", VARINT_EXAMPLES)
def test_varint_spec_examples(value: int, hex_bytes: str) -> None:
    encoded = bytes.fromhex(hex_bytes)
    assert encode_varint(value) == encoded
    reader = BincodeReader(encoded)
    assert reader.varint() == value
    assert reader.pos == len(encoded)


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_varint_round_trip(value: int) -> None:
    assert BincodeReader(encode_varint(value)).varint() == value


def test_varint_reader_accepts_longer_than_needed_form() -> None:
    assert BincodeReader(bytes.fromhex("fb 05 00")).varint() == 5


@pytest.mark.parametrize("value", [-1, 2**64])
def test_varint_out_of_range_refused(value: int) -> None:
    with pytest.raises(ValueError):
        encode_varint(value)


def test_u64_marker_in_u32_field_is_refused() -> None:
    data = bytes.fromhex("00 fd 00 00 00 00 01 00 00 00")
    reader = BincodeReader(data, pos=1)
    with pytest.raises(PayloadDecodeError, match=r"byte 1 \(schema_version\).*too wide for a u32"):
        reader.varint(32, "schema_version")


@pytest.mark.parametrize("marker", ["fe", "ff"])
def test_u128_and_reserved_markers_are_refused(marker: str) -> None:
    with pytest.raises(PayloadDecodeError, match=f"0x{marker}"):
        BincodeReader(bytes.fromhex(marker + "00" * 16)).varint(64, "request_id")


def test_truncated_varint_names_position() -> None:
    with pytest.raises(PayloadDecodeError, match=r"at byte 1: need 2 bytes, only 1 left"):
        BincodeReader(bytes.fromhex("fb 01")).varint()


def test_bool_accepts_only_0_and_1() -> None:
    reader = BincodeReader(bytes.fromhex("00 01 02"))
    assert reader.bool() is False
    assert reader.bool() is True
    with pytest.raises(PayloadDecodeError, match=r"byte 2 \(flag\).*invalid bool byte 0x02"):
        reader.bool("flag")


def test_option_invalid_tag() -> None:
    reader = BincodeReader(bytes.fromhex("02 00"))
    with pytest.raises(PayloadDecodeError, match=r"byte 0 \(subscription_name\).*Option tag 0x02"):
        reader.option(reader.string, "subscription_name")


def test_option_none_and_some() -> None:
    w = BincodeWriter()
    w.option(None, w.varint)
    w.option(300, w.varint)
    assert w.getvalue() == bytes.fromhex("00 01 fb 2c 01")
    r = BincodeReader(w.getvalue())
    assert r.option(r.varint) is None
    assert r.option(r.varint) == 300


def test_invalid_utf8_string_is_refused() -> None:
    with pytest.raises(PayloadDecodeError, match=r"byte 0 \(producer_name\).*invalid UTF-8"):
        BincodeReader(bytes.fromhex("02 c3 28")).string("producer_name")


def test_string_shorter_than_its_length() -> None:
    with pytest.raises(PayloadDecodeError, match=r"at byte 1: need 5 bytes, only 2 left"):
        BincodeReader(bytes.fromhex("05 61 62")).string()


def test_bytes_are_not_expanded() -> None:
    payload = bytes(range(256)) + bytes(range(44))
    w = BincodeWriter()
    w.bytes_(payload)
    encoded = w.getvalue()
    assert len(encoded) == 303 and encoded[:3] == bytes.fromhex("fb 2c 01")
    assert encoded[3:] == payload
    assert BincodeReader(encoded).bytes_() == payload


def test_u8_is_a_raw_byte() -> None:
    w = BincodeWriter()
    w.u8(255)
    assert w.getvalue() == b"\xff"
    assert BincodeReader(b"\xff").u8() == 255


def test_string_map_keeps_order() -> None:
    w = BincodeWriter()
    w.string_map({"z": "1", "a": "2"})
    assert w.getvalue() == bytes.fromhex("02 01 7a 01 31 01 61 01 32")
    decoded = BincodeReader(w.getvalue()).string_map()
    assert list(decoded.items()) == [("z", "1"), ("a", "2")]


def test_reader_on_memoryview_and_bytearray() -> None:
    data = bytearray(bytes.fromhex("ff 03 61 62 63"))
    reader = BincodeReader(memoryview(data), pos=1)
    assert reader.string() == "abc"
    assert BincodeReader(data, 1).string() == "abc"
