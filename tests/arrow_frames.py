"""Frames for the Arrow decoder's tests: typical messages, their frames, and both decoders at once.

`decode_both` runs the C decoder and the pure-Python reference on the same bytes and requires
identical results, so the C code can never drift from `danube_core.message`.
"""

from __future__ import annotations

import dataclasses

from danube_core.arrow_decode import DecodedFrames, decode_frames, decode_frames_reference
from danube_core.frames import encode_frame
from danube_core.message import MessageID, StreamMessage, encode_message


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
    """Decode with both decoders, require identical results, return the fast one."""
    fast = decode_frames(buf, **kwargs)
    ref = decode_frames_reference(buf, **kwargs)
    fast.batch.validate(full=True)
    assert fast.batch.schema == ref.batch.schema
    assert fast.batch.equals(ref.batch), (fast.batch.to_pylist(), ref.batch.to_pylist())
    assert (fast.consumed, fast.stop_reason, fast.stop_pos, fast.stop_detail, fast.stop_offset) == (
        ref.consumed,
        ref.stop_reason,
        ref.stop_pos,
        ref.stop_detail,
        ref.stop_offset,
    )
    return fast


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
