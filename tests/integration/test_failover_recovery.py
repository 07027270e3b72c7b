"""Failover without loss: a broker killed after acknowledging messages that are in its WAL but
not yet in objects. The next owner (another WAL directory, same etcd and object store) must
upload them from the dead broker's WAL before handing out offsets: every offset readable
exactly once, none handed out twice. If that WAL cannot be read, the loss is logged with the
broker, the URL and the offsets at risk, and the topic continues after the uploaded offsets.

Storage-engine level: the leader's part is `leader.record_failover`, the dead broker's part is
its broker state with `wal_url` (as `cluster.ClusterMembership.join` writes it).
"""

from __future__ import annotations

import logging
import os
import random
from typing import Callable, Iterator

import pytest

from broker.leader import record_failover
from broker.storage_engine import StorageEngine
from danube_core.keys import StorageKeys, broker_state_key, delivery_key
from danube_core.records import (
    NON_RELIABLE, RELIABLE, BrokerState, ObjectDescriptor, SealedState, dump_delivery,
)
from danube_core.topics import TopicName
from tests.storage_engines import ROOT, storage_engines
from tests.unit.test_uploader import make_msg

KEYS = StorageKeys(ROOT)
ACKED = 30  # offsets 0..29 flushed (durable) on A
UPLOADED = 10  # of which 0..9 are in an object


@pytest.fixture
def broker_ids(metadata) -> Iterator[tuple[int, int]]:
    ids = (random.getrandbits(64), random.getrandbits(64))
    yield ids
    for broker_id in ids:
        metadata.delete(broker_state_key(broker_id))


@pytest.fixture
def topic(unique_name, metadata) -> TopicName:
    name = TopicName("default", unique_name("failover").replace("-", "_"))
    metadata.put(delivery_key(name), dump_delivery(RELIABLE))
    return name


@pytest.fixture
def make_engine(tmp_path, metadata) -> Iterator[Callable[[str, int], StorageEngine]]:
    with storage_engines(tmp_path, metadata, f"file://{tmp_path}/cloud", durable=True) as make:
        yield make


def crash_after_partial_upload(engine: StorageEngine, topic: TopicName) -> str:
    """On `engine`: ack 0..ACKED-1 durably, upload only 0..UPLOADED-1, die with a torn frame
    behind the last acked one (a write cut short by kill -9). Returns the topic's WAL dir."""
    storage = engine.load_topic(topic)
    storage.uploader.stop()  # no background cycle: exactly what is uploaded is decided here
    for i in range(ACKED):
        assert storage.append(make_msg(i, topic.broker_name)) == i
        if i == UPLOADED - 1:
            storage.wal.flush()
            assert storage.uploader.run_cycle().end_offset == UPLOADED - 1
    assert storage.wal.flush() == ACKED - 1
    active = storage.wal.segments()[-1].path
    engine.close()  # no seal, no upload: local files kept, as after kill -9
    with open(active, "ab") as fh:
        fh.write(b"\x1e\x00\x00\x00\x00\x00\x00\x00\x40\x00")  # half a frame header of offset 30
    return storage.wal.directory


def announce_death(metadata, topic: TopicName, dead: int, wal_url: str | None) -> None:
    """What the dead broker left (its broker state) and what the leader writes at failover."""
    metadata.put(broker_state_key(dead), BrokerState("active", "boot", wal_url=wal_url).to_json())
    assert record_failover(metadata, KEYS, topic, dead, 1_700_000_000)


def descriptors(metadata, topic: TopicName) -> list[ObjectDescriptor]:
    rows = metadata.get_range(KEYS.objects_prefix(topic), KEYS.cur_key(topic))
    return [ObjectDescriptor.from_json(raw, key) for key, raw in rows]


def dir_snapshot(directory: str) -> dict[str, bytes]:
    return {name: open(os.path.join(directory, name), "rb").read() for name in sorted(os.listdir(directory))}


def test_acked_but_unuploaded_messages_survive_failover_to_another_wal_dir(
    make_engine, metadata, topic, broker_ids, tmp_path
):
    a, b = broker_ids
    wal_dir_a = crash_after_partial_upload(make_engine("a", a), topic)
    announce_death(metadata, topic, a, f"file://{tmp_path}/a/wal")
    before = dir_snapshot(wal_dir_a)

    on_b = make_engine("b", b).load_topic(topic)

    assert on_b.next_offset == ACKED
    assert metadata.get(KEYS.state_key(topic)) is None  # consumed before serving
    spans = [(d.start_offset, d.end_offset) for d in descriptors(metadata, topic)]
    assert spans == [(0, UPLOADED - 1), (UPLOADED, ACKED - 1)]
    got = [(m.msg_id.topic_offset, m.payload) for m in on_b.reader(0)]
    assert got == [(i, make_msg(i, topic.broker_name).payload) for i in range(ACKED)]
    assert on_b.append(make_msg(ACKED, topic.broker_name)) == ACKED
    assert [m.msg_id.topic_offset for m in on_b.reader(ACKED - 1)] == [ACKED - 1, ACKED]
    assert dir_snapshot(wal_dir_a) == before, "the dead broker's WAL must only be read"


@pytest.mark.parametrize("where", ["missing-dir", "no-wal-url"])
def test_unreachable_previous_wal_is_logged_and_topic_continues_after_uploads(
    make_engine, metadata, topic, broker_ids, tmp_path, caplog, where
):
    a, b = broker_ids
    crash_after_partial_upload(make_engine("a", a), topic)
    url = f"file://{tmp_path}/elsewhere/wal" if where == "missing-dir" else None
    announce_death(metadata, topic, a, url)

    with caplog.at_level(logging.ERROR, logger="broker.topic_storage"):
        on_b = make_engine("b", b).load_topic(topic)

    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    assert f"broker {a}" in errors[0] and f"from {UPLOADED} on" in errors[0]
    assert (url or "no wal_url") in errors[0]
    assert on_b.next_offset == UPLOADED
    assert metadata.get(KEYS.state_key(topic)) is None
    assert on_b.append(make_msg(99, topic.broker_name)) == UPLOADED


def test_same_wal_dir_restart_recovers_through_the_local_wal(make_engine, metadata, topic, broker_ids, tmp_path):
    """A restart on the same host has a new id but the same directory: its own WAL and
    uploader.ckpt recover the tail, the failover record must not make it upload twice."""
    a, b = broker_ids
    crash_after_partial_upload(make_engine("a", a), topic)
    announce_death(metadata, topic, a, f"file://{tmp_path}/a/wal")

    restarted = make_engine("a", b).load_topic(topic)

    assert restarted.next_offset == ACKED
    restarted.uploader.drain()
    spans = [(d.start_offset, d.end_offset) for d in descriptors(metadata, topic)]
    assert spans == [(0, UPLOADED - 1), (UPLOADED, ACKED - 1)]
    assert [m.msg_id.topic_offset for m in restarted.reader(0)] == list(range(ACKED))


def test_record_failover_keeps_a_sealed_state_and_skips_non_reliable_topics(metadata, topic, unique_name):
    sealed = SealedState(broker_id=7, last_committed_offset=41, sealed=True, timestamp=1_700_000_000)
    metadata.put(KEYS.state_key(topic), sealed.to_json())
    assert not record_failover(metadata, KEYS, topic, 8, 1_700_000_001)
    assert metadata.get(KEYS.state_key(topic)) == sealed.to_json()

    plain = TopicName("default", unique_name("plain").replace("-", "_"))
    metadata.put(delivery_key(plain), dump_delivery(NON_RELIABLE))
    assert not record_failover(metadata, KEYS, plain, 8, 1_700_000_001)
    assert metadata.get(KEYS.state_key(plain)) is None

    fresh = TopicName("default", unique_name("fresh").replace("-", "_"))
    metadata.put(delivery_key(fresh), dump_delivery(RELIABLE))
    assert record_failover(metadata, KEYS, fresh, 8, 1_700_000_001)
    assert metadata.get(KEYS.state_key(fresh)) == (
        b'{"broker_id":8,"last_committed_offset":0,"sealed":false,"timestamp":1700000001}')


def wal_frames(directory: str) -> dict[int, bytes]:
    """Every whole frame of the WAL files in `directory`, by offset."""
    from danube_core.frames import scan_frames

    out = {}
    for name in sorted(os.listdir(directory)):
        if name.startswith("wal") and name.endswith(".log"):
            data = open(os.path.join(directory, name), "rb").read()
            out.update({ref.offset: data[ref.frame_pos:ref.end_pos] for ref in scan_frames(data).frames})
    return out


@pytest.mark.parametrize("orphan_frames", ["the-dead-wals", "other"])
def test_an_object_the_dead_broker_uploaded_without_its_descriptor_is_deleted_once_recovered(
    make_engine, metadata, topic, broker_ids, tmp_path, orphan_frames
):
    """The soak's open defect 3 (issue 43), the broker's side: the dead broker had uploaded
    offsets 10..11 and died before putting their descriptor. The next owner uploads 10..29 again
    from its WAL; the old object, the same frames byte for byte, is deleted, so no reader finds
    it. An unreferenced object with other frames there is not the recovery's to delete: kept."""
    from danube_core.frames import encode_frame
    from danube_core.message import encode_message
    from danube_core.objectstore import ObjectStore, object_id_for

    a, b = broker_ids
    wal_dir_a = crash_after_partial_upload(make_engine("a", a), topic)
    frames = wal_frames(wal_dir_a)
    if orphan_frames == "other":
        frames[11] = encode_frame(11, encode_message(make_msg(111, topic.broker_name)))
    store = ObjectStore(f"file://{tmp_path}/cloud")
    orphan = object_id_for(UPLOADED, 1_700_000_000)
    with store.open_writer(topic, orphan) as writer:
        writer.write(frames[10] + frames[11])
    announce_death(metadata, topic, a, f"file://{tmp_path}/a/wal")

    on_b = make_engine("b", b).load_topic(topic)

    spans = [(d.start_offset, d.end_offset) for d in descriptors(metadata, topic)]
    assert spans == [(0, UPLOADED - 1), (UPLOADED, ACKED - 1)]
    assert [m.msg_id.topic_offset for m in on_b.reader(0)] == list(range(ACKED))
    assert store.exists(store.object_path(topic, orphan)) == (orphan_frames == "other")
