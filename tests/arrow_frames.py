"""Frames for the Arrow decoder's tests: typical messages, their frames, and every decoder at once.

`decode_both` runs each decoder this install has (the C one where it was built, and the
pure one that replaces it elsewhere) and the pure-Python reference on the same bytes and
requires identical results, so neither decoder can drift from `danube_core.message`.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType

from danube_core import pure_decode
from danube_core.arrow_decode import DecodedFrames, decode_frames, decode_frames_reference
from danube_core.frames import encode_frame
from danube_core.message import MessageID, StreamMessage, encode_message


try:
    from danube_core import _fastdecode as C_DECODER  # type: ignore[attr-defined]
except ImportError:  # installed without a C compiler: the pure decoder alone is checked
    C_DECODER = None
DECODERS: list[ModuleType] = [d for d in (C_DECODER, pure_decode) if d is not None]


def message(offset: int = 0, **changes) -> StreamMessage:
    """A typical broker-stored message at `offset`, with any field replaced."""
    base = StreamMessage(
        request_id=offset + 1,
        msg_id=MessageID(42, "/default/orders", "http://127.0.0.1:6650/", offset),
        payload=b"x" * 100,
        publish_time=1_700_000_000_000 + offset,
        producer_name="producer-1",
        subscription_name="",
        attributes={"k": "v"},
    )
    return dataclasses.replace(base, **changes)


def frame(msg: StreamMessage) -> bytes:
    return encode_frame(msg.msg_id.topic_offset, encode_message(msg))


def frames(count: int, start: int = 0) -> bytes:
    return b"".join(frame(message(offset)) for offset in range(start, start + count))


def raw_frame(offset: int, payload: bytes) -> bytes:
    """A frame with a correct CRC around arbitrary (possibly invalid) payload bytes."""
    return encode_frame(offset, payload)


def decode_both(buf, **kwargs) -> DecodedFrames:
    """Decode with every decoder and the reference, require identical results, return the first decoder's."""
    ref = decode_frames_reference(buf, **kwargs)
    results = [decode_frames(buf, **kwargs, _decoder=decoder) for decoder in DECODERS]
    for decoder, fast in zip(DECODERS, results):
        assert_same(fast, ref, decoder.__name__)
    return results[0]


def assert_same(fast: DecodedFrames, ref: DecodedFrames, label: str) -> None:
    """The same rows (schema, values, validated buffers) and the same stop."""
    fast.batch.validate(full=True)
    assert fast.batch.schema == ref.batch.schema, label
    assert fast.batch.equals(ref.batch), (label, fast.batch.to_pylist(), ref.batch.to_pylist())
    assert (fast.consumed, fast.stop_reason, fast.stop_pos, fast.stop_detail, fast.stop_offset) == (
        ref.consumed,
        ref.stop_reason,
        ref.stop_pos,
        ref.stop_detail,
        ref.stop_offset,
    ), label


def expected_row(msg: StreamMessage, frame_pos: int) -> dict:
    return {
        "offset": msg.msg_id.topic_offset,
        "request_id": msg.request_id,
        "producer_id": msg.msg_id.producer_id,
        "topic_name": msg.msg_id.topic_name,
        "broker_addr": msg.msg_id.broker_addr,
        "topic_offset": msg.msg_id.topic_offset,
        "payload": msg.payload,
        "publish_time": msg.publish_time,
        "producer_name": msg.producer_name,
        "subscription_name": msg.subscription_name,
        "attributes": list(msg.attributes.items()),
        "schema_id": msg.schema_id,
        "schema_version": msg.schema_version,
        "frame_pos": frame_pos,
    }
