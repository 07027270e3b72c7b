"""The pure decoder (`danube_core.pure_decode`) against the reference and the C decoder.

It replaces the C decoder where that was not built, so it must give the same rows, stops and
details on any input: random messages, damaged payloads behind a correct CRC (decode stops),
damaged frames (CRC and partial stops), with filters, row limits and column selections. Its
own paths are pinned too: attribute rounds across many messages, the message-by-message path
for long attribute lists, values near the end of the buffer, the join used past 2 GiB, and the
choice made at import.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from danube_core import pure_decode
from danube_core import arrow_decode
from danube_core.arrow_decode import (
    MESSAGE_ARROW_SCHEMA,
    PURE_DECODER_COST,
    decode_frames,
    decode_frames_reference,
    scan_frame_offsets,
)
from danube_core.bincode import BincodeWriter
from danube_core.frames import encode_frame, scan_frames
from tests.arrow_frames import DECODERS, assert_same, decode_both, frames

pytestmark = pytest.mark.unit

U64_MAX = 2**64 - 1

u64s = st.one_of(st.integers(0, 300), st.sampled_from([251, 65536, 2**32, U64_MAX]), st.integers(0, U64_MAX))
names = st.one_of(st.sampled_from(["", "k", "region", "content-type", "a-much-longer-attribute-key"]),
                  st.text(max_size=20))
pairs = st.lists(st.tuples(names, names), max_size=6)  # duplicate keys included, in file order


def payload(request_id: int, topic: str, body: bytes, sub: str | None, attrs: list[tuple[str, str]],
            schema_id: int | None, schema_version: int | None) -> bytes:
    """A StreamMessage payload with attribute entries written as given (duplicates kept)."""
    w = BincodeWriter()
    w.varint(request_id)
    w.varint(7)
    w.string(topic)
    w.string("http://127.0.0.1:6650/")
    w.varint(request_id)
    w.bytes_(body)
    w.varint(1_700_000_000_000)
    w.string("producer-1")
    w.option(sub, w.string)
    w.varint(len(attrs))
    for key, value in attrs:
        w.string(key)
        w.string(value)
    w.option(schema_id, w.varint)
    w.option(schema_version, w.varint)
    return w.getvalue()


payloads = st.builds(payload, u64s, names, st.binary(max_size=40), st.none() | names, pairs,
                     st.none() | u64s, st.none() | st.integers(0, 2**32 - 1))


@st.composite
def damaged_buffers(draw) -> bytes:
    """Frames of random payloads; some payloads damaged behind a correct CRC, the buffer maybe cut
    or a stored byte flipped (a CRC stop)."""
    parts = []
    for offset, body in enumerate(draw(st.lists(payloads, max_size=24))):
        if draw(st.integers(0, 9)) == 0 and body:
            at = draw(st.integers(0, len(body) - 1))
            body = body[:at] + bytes([draw(st.integers(0, 255))]) + body[at + 1:]
        if draw(st.integers(0, 14)) == 0:
            body = body[: draw(st.integers(0, len(body)))]
        parts.append(encode_frame(offset, body))
    buf = bytearray(b"".join(parts))
    if buf and draw(st.integers(0, 9)) == 0:
        buf[draw(st.integers(0, len(buf) - 1))] ^= 1 << draw(st.integers(0, 7))
    return bytes(buf[: len(buf) - draw(st.integers(0, 20))])


def check_all(buf: bytes, **kwargs) -> None:
    ref = decode_frames_reference(buf, **kwargs)
    for decoder in DECODERS:
        assert_same(decode_frames(buf, **kwargs, _decoder=decoder), ref, decoder.__name__)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damaged_buffers(), st.integers(0, 2**40))
def test_damaged_buffers_stop_where_the_reference_stops(buf: bytes, base_pos: int) -> None:
    check_all(buf, base_pos=base_pos)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    damaged_buffers(),
    st.integers(0, 30),
    st.integers(0, 30),
    st.none() | st.integers(0, 12),
    st.none() | st.lists(st.sampled_from(MESSAGE_ARROW_SCHEMA.names), min_size=1, unique=True),
    st.none() | st.integers(0, 400),
)
def test_filters_limits_and_columns_on_damaged_buffers(buf, lo, hi, max_frames, columns, batch_bytes) -> None:
    kwargs = {"min_offset": lo, "max_offset": hi, "max_frames": max_frames, "columns": columns}
    if batch_bytes is not None:
        kwargs["_max_batch_bytes"] = batch_bytes
    check_all(buf, **kwargs)


@settings(max_examples=100, deadline=None)
@given(damaged_buffers(), st.integers(0, 2**40))
def test_scan_matches_the_c_decoder_and_the_frame_scanner(buf: bytes, base_pos: int) -> None:
    offsets, positions, consumed, stop = scan_frame_offsets(buf, base_pos, _decoder=pure_decode)
    expected = scan_frames(buf)
    assert offsets.tolist() == [ref.offset for ref in expected.frames]
    assert positions.tolist() == [base_pos + ref.frame_pos for ref in expected.frames]
    assert (consumed, stop) == (expected.safe_end, expected.stop_reason)
    for decoder in DECODERS:
        other = scan_frame_offsets(buf, base_pos, _decoder=decoder)
        assert (other[0].tolist(), other[1].tolist(), other[2:]) == (offsets.tolist(), positions.tolist(),
                                                                       (consumed, stop))


def test_duplicate_keys_in_attribute_rounds_and_one_by_one() -> None:
    """Many messages share the numpy rounds, the long lists go message by message; same dict rules."""
    entries = [("a", "1"), ("b", "2"), ("a", "3"), ("", "x"), ("", "y")]
    long_list = [(f"k{i % 40}", f"v{i}") for i in range(300)]
    bodies = [payload(i, "/t", b"p", "", entries if i % 3 else long_list, None, None) for i in range(60)]
    buf = b"".join(encode_frame(i, body) for i, body in enumerate(bodies))
    rows = decode_both(buf).batch.column("attributes").to_pylist()
    assert rows[1] == [("a", "3"), ("b", "2"), ("", "y")]
    assert rows[0] == list(dict(long_list).items())


def test_values_past_2_gib_are_joined_instead_of_viewed(monkeypatch) -> None:
    """Arrow's binary views address the input with int32 offsets; beyond that the values are joined."""
    buf = frames(40)
    expected = decode_frames_reference(buf)
    monkeypatch.setattr(pure_decode, "_VIEW_MAX_OFFSET", -1)
    assert_same(decode_frames(buf, _decoder=pure_decode), expected, "joined")


def test_short_values_at_the_end_of_the_buffer() -> None:
    tail = encode_frame(0, payload(1, "/t", b"", "s", [("k", "v")], None, None))
    decode_both(tail)
    decode_both(frames(3) + tail)


def test_import_without_the_c_decoder_falls_back_once_and_says_what_it_costs() -> None:
    script = textwrap.dedent("""
        import logging, sys
        sys.modules["danube_core._fastdecode"] = None  # as if built without a C compiler
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
        from danube_core import arrow_decode, pure_decode
        from danube_core.arrow_decode import decode_frames
        from danube_core.frames import encode_frame, scan_frames
        assert arrow_decode.FRAME_DECODER is pure_decode
        decode_frames(b"")
        decode_frames(b"")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1, done.stderr
    assert "danube_core._fastdecode" in warnings[0] and PURE_DECODER_COST in warnings[0]


@pytest.mark.skipif(len(DECODERS) == 1, reason="the C decoder is not built here")
def test_the_c_decoder_is_chosen_where_it_was_built() -> None:
    assert arrow_decode.FRAME_DECODER is DECODERS[0] is not pure_decode
