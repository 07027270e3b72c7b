"""`StreamMessage` / `MessageID` and their bincode payload (spec §2.4–2.7).

This is the payload inside every WAL frame and cloud object. Field order is the Rust struct
declaration order; there are no tags, so every field must be written, in order.

Attribute maps are written in the dict's own order. The broker writes them in an arbitrary
(hash) order; decoding keeps the file order, so a decoded broker message re-encodes byte for
byte. Code creating *new* messages should sort the keys for deterministic output.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from danube_core.bincode import BincodeReader, BincodeWriter


@dataclass
class MessageID:
    """Identity of a stored message; `topic_offset` equals the frame header offset (§2.6)."""

    producer_id: int
    topic_name: str
    broker_addr: str
    topic_offset: int


@dataclass
class StreamMessage:
    """One message as the broker stores it.

    `subscription_name` is `""` (Some("")) for everything the broker stores (§8.2); None is
    representable because the type is Option<String>. `publish_time` is milliseconds.
    """

    request_id: int
    msg_id: MessageID
    payload: bytes
    publish_time: int
    producer_name: str
    subscription_name: str | None = ""
    attributes: dict[str, str] = field(default_factory=dict)
    schema_id: int | None = None
    schema_version: int | None = None


def encode_message(msg: StreamMessage) -> bytes:
    """Bincode payload of `msg`, identical to the broker's `encode_to_vec(msg, standard())`."""
    w = BincodeWriter()
    w.varint(msg.request_id)
    mid = msg.msg_id
    w.varint(mid.producer_id)
    w.string(mid.topic_name)
    w.string(mid.broker_addr)
    w.varint(mid.topic_offset)
    w.bytes_(msg.payload)
    w.varint(msg.publish_time)
    w.string(msg.producer_name)
    w.option(msg.subscription_name, w.string)
    w.string_map(msg.attributes)
    w.option(msg.schema_id, w.varint)
    if msg.schema_version is not None and msg.schema_version > 0xFFFFFFFF:
        raise ValueError(f"schema_version {msg.schema_version} does not fit a u32")
    w.option(msg.schema_version, w.varint)
    return w.getvalue()


def decode_message(buf: bytes | bytearray | memoryview, pos: int = 0) -> StreamMessage:
    """Decode one payload starting at `pos`. Trailing bytes are ignored, as the broker does.

    Raises PayloadDecodeError naming the field and byte position on malformed input.
    """
    r = BincodeReader(buf, pos)
    request_id = r.varint(64, "request_id")
    msg_id = MessageID(
        producer_id=r.varint(64, "msg_id.producer_id"),
        topic_name=r.string("msg_id.topic_name"),
        broker_addr=r.string("msg_id.broker_addr"),
        topic_offset=r.varint(64, "msg_id.topic_offset"),
    )
    payload = r.bytes_("payload")
    publish_time = r.varint(64, "publish_time")
    producer_name = r.string("producer_name")
    subscription_name = r.option(lambda: r.string("subscription_name"), "subscription_name")
    attributes = r.string_map("attributes")
    schema_id = r.option(lambda: r.varint(64, "schema_id"), "schema_id")
    schema_version = r.option(lambda: r.varint(32, "schema_version"), "schema_version")
    return StreamMessage(
        request_id=request_id,
        msg_id=msg_id,
        payload=payload,
        publish_time=publish_time,
        producer_name=producer_name,
        subscription_name=subscription_name,
        attributes=attributes,
        schema_id=schema_id,
        schema_version=schema_version,
    )


def with_offset(msg: StreamMessage, offset: int) -> StreamMessage:
    """Copy of `msg` stamped with the WAL offset, as `Wal::append` does before encoding (§2.6)."""
    # Built directly rather than with dataclasses.replace: this runs once per appended
    # message and replace() re-runs field introspection each call.
    mid = msg.msg_id
    return StreamMessage(
        msg.request_id,
        MessageID(mid.producer_id, mid.topic_name, mid.broker_addr, offset),
        msg.payload,
        msg.publish_time,
        msg.producer_name,
        msg.subscription_name,
        msg.attributes,
        msg.schema_id,
        msg.schema_version,
    )
