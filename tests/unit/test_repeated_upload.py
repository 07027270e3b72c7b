"""`danube_core.repeated_upload`: an unreferenced object is a repeated upload only when every one of
its frames equals the described frame at that offset, byte for byte (issue 43, open defect 3).

Table-driven over one described history (objects of offsets 0..2499 and 2500..2599, the first
with a three-entry sparse index) and orphans cut from it or changed in one field.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest

from danube_core.errors import ObjectMissingError
from danube_core.frames import encode_frame
from danube_core.message import MessageID, StreamMessage, encode_message
from danube_core.objectstore import ObjectStore, object_id_for
from danube_core.records import ObjectDescriptor
from danube_core.repeated_upload import index_position, object_frames, repeats_described
from danube_core.topics import TopicName

pytestmark = pytest.mark.unit

TOPIC = TopicName("default", "repeats")


def message(offset: int) -> StreamMessage:
    return StreamMessage(request_id=offset + 1, msg_id=MessageID(7, "/default/repeats", "http://b:6650", offset),
                         payload=f"m{offset}".encode(), publish_time=1_700_000_000_000 + offset,
                         producer_name="p", subscription_name="", attributes={"k": str(offset)})


def frame(offset: int, msg: StreamMessage | None = None) -> bytes:
    return encode_frame(offset, encode_message(msg or message(offset)))


@pytest.fixture
def history():
    """(store, the described objects' descriptors): 0..2499 in one object, 2500..2599 in another."""
    store = ObjectStore(f"memory://repeats-{uuid.uuid4().hex}")
    described = []
    for first, last, secs in ((0, 2499, 100), (2500, 2599, 101)):
        index, data = [], b""
        for offset in range(first, last + 1):
            if (offset - first) % 1000 == 0:
                index.append((offset, len(data)))
            data += frame(offset)
        object_id = object_id_for(first, secs)
        with store.open_writer(TOPIC, object_id) as writer:
            writer.write(data)
        described.append(ObjectDescriptor(object_id=object_id, start_offset=first, end_offset=last, size=len(data),
                                          etag=None, created_at=secs, completed=True, offset_index=index))
    return store, described


def orphan(store: ObjectStore, first: int, data: bytes) -> str:
    object_id = object_id_for(first, 99)
    with store.open_writer(TOPIC, object_id) as writer:
        writer.write(data)
    return store.object_path(TOPIC, object_id)


def run(first: int, last: int) -> bytes:
    return b"".join(frame(o) for o in range(first, last + 1))


CASES = {
    "the same frames inside one object": (1998, run(1998, 2003), True),
    "the same frames across two objects": (2490, run(2490, 2510), True),
    "the whole history": (0, run(0, 2599), True),
    "one byte of a payload": (1998, run(1998, 2000) + frame(2001, replace(message(2001), payload=b"m2001!")),
                              False),
    "the publish time 1 ms later": (10, frame(10, replace(message(10), publish_time=message(10).publish_time + 1)),
                                    False),
    "another request id (the producer's sequence)": (10, frame(10, replace(message(10), request_id=99)), False),
    "another producer id": (10, frame(10, replace(message(10), msg_id=replace(message(10).msg_id, producer_id=8))),
                            False),
    "a frame past the described offsets": (2598, run(2598, 2599) + frame(2600), False),
    "a torn last frame": (40, run(40, 42) + frame(43)[:20], False),
    "a corrupt last frame": (40, run(40, 42) + frame(43)[:-1] + b"\xff", False),
    "an offset skipped": (40, frame(40) + frame(42), False),
    "frames from below the name's offset": (40, run(39, 41), False),
    "no frame at all": (40, b"", False),
}


@pytest.mark.parametrize("case", CASES)
def test_a_repeated_upload_has_every_frame_equal_byte_for_byte(history, case):
    store, described = history
    first, data, expected = CASES[case]
    path = orphan(store, first, data)
    assert repeats_described(store, path, first, described, lambda i: store.object_path(TOPIC, i)) is expected


def test_a_gap_in_the_descriptors_is_no_evidence(history):
    store, described = history
    path = orphan(store, 2490, run(2490, 2510))
    assert not repeats_described(store, path, 2490, described[:1], lambda i: store.object_path(TOPIC, i))


def test_a_described_object_gone_raises_object_missing(history):
    store, described = history
    store.delete(store.object_path(TOPIC, described[1].object_id))
    path = orphan(store, 2500, run(2500, 2501))
    with pytest.raises(ObjectMissingError):
        repeats_described(store, path, 2500, described, lambda i: store.object_path(TOPIC, i))


def test_comparison_starts_at_the_index_entry_below_the_first_offset(history):
    store, described = history
    assert index_position(described[0], 1998) == index_position(described[0], 1000) > 0
    path = store.object_path(TOPIC, described[0].object_id)
    offsets = [o for o, _ in object_frames(store, path, index_position(described[0], 1998), chunk_bytes=64)]
    assert offsets == list(range(1000, 2500))
