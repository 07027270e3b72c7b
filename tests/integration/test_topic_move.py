"""Seed 003, the reliable topic move, done right: two brokers (A, B) with their own WAL
directories share one real etcd and one object store (moto S3, and local files).

Timeline: 0–21 appended on A, a subscription acked up to 13, A unloads (sealed state 21,
local WAL files and checkpoints kept, as the broker keeps them: §6.2), B loads at 22 (marker
deleted), 22–27 appended on B, a reader on B from the cursor gets 14..27 exactly once, and the
etcd keys are those of spec §5.2/§5.3. Also: an owner that crashes instead of unloading makes
the next one continue after the descriptors; brokers sharing one WAL directory (Danube's own CI
layout) and a topic moving back to a broker that kept its old WAL continue without reusing or
re-uploading an offset.
"""

from __future__ import annotations

import json
import os
import re
from typing import Callable, Iterator

import pytest
from fsspec.implementations.local import LocalFileSystem

from broker.storage_engine import StorageEngine, StorageSettings
from broker.topic_storage import TopicClosedError
from broker.wal import WalConfig
from broker.uploader import ReadOnlyWal
from danube_core.wal_files import read_segments
from danube_core.checkpoints import UploaderCheckpoint, WalCheckpoint, read_checkpoint
from danube_core.errors import ConfigError
from danube_core.records import ObjectDescriptor
from danube_core.topics import TopicName
from tests.storage_engines import ROOT, storage_engines
from tests.unit.test_uploader import append_messages, make_msg

BROKER_A = 10285063371164059634  # > 2^53: must stay exact in JSON
BROKER_B = 10421046117770015389


@pytest.fixture(params=["s3", "file"])
def cloud(request, tmp_path) -> tuple[str, dict]:
    if request.param == "file":
        return f"file://{tmp_path}/cloud-storage", {}
    moto_s3 = request.getfixturevalue("moto_s3")
    return f"s3://{request.getfixturevalue('s3_bucket')}", moto_s3.storage_options


@pytest.fixture
def make_engine(tmp_path, metadata, cloud) -> Iterator[Callable[[str, int], StorageEngine]]:
    with storage_engines(tmp_path, metadata, *cloud, durable=False) as make:
        yield make


@pytest.fixture
def topic(unique_name) -> TopicName:
    return TopicName("default", unique_name("reliable").replace("-", "_"))


def storage_keys(metadata, topic: TopicName) -> dict[str, bytes]:
    return dict(metadata.get_prefix(f"{ROOT}/storage/topics/{topic.storage_path}/"))


def check_descriptor(raw: bytes, start: int, end: int) -> ObjectDescriptor:
    text = raw.decode()
    assert re.fullmatch(
        r'\{"completed":true,"created_at":\d+,"end_offset":%d,"etag":(null|"[^"]*"|"\\"[^"]*\\""),'
        r'"object_id":"data-%d-\d+\.dnb1","offset_index":\[\[%d,0\]\],"size":\d+,"start_offset":%d\}'
        % (end, start, start, start), text), text
    return ObjectDescriptor.from_json(raw, "descriptor")


def assert_wal_kept(directory: str, topic: TopicName, offsets: range) -> None:
    """The unloaded owner's WAL is still on disk, whole and readable: frames, wal.ckpt
    (listing the files), uploader.ckpt (everything uploaded), and no temp file left over."""
    names = set(os.listdir(directory))
    assert {"wal.ckpt", "uploader.ckpt"} <= names and not names & {"wal.tmp", "uploader.tmp"}
    wal_ckpt = read_checkpoint(os.path.join(directory, "wal.ckpt"), WalCheckpoint)
    assert wal_ckpt.last_offset == offsets[-1]
    listed = {os.path.basename(path) for _, path, _ in wal_ckpt.rotated_files} | {os.path.basename(wal_ckpt.file_path)}
    assert listed <= names
    uploaded = read_checkpoint(os.path.join(directory, "uploader.ckpt"), UploaderCheckpoint)
    assert uploaded.last_committed_offset == offsets[-1]
    kept = ReadOnlyWal.open(directory, LocalFileSystem())
    messages = list(read_segments(kept.segments(), 0))
    assert [m.msg_id.topic_offset for m in messages] == list(offsets)
    assert [m.payload for m in messages] == [make_msg(i, topic.broker_name).payload for i in offsets]


def test_seed_003_timeline(make_engine, metadata, topic):
    engine_a, engine_b = make_engine("a", BROKER_A), make_engine("b", BROKER_B)
    objects = f"{ROOT}/storage/topics/{topic.storage_path}/objects/"
    state_key = f"{ROOT}/storage/topics/{topic.storage_path}/state"
    cursor_key = f"/topics/{topic.storage_path}/subscriptions/subs_reliable/cursor"

    # T1-T3: 0..21 on A, a consumer acks 0..13 (fewer than 1000 acks and < 5 s: not flushed yet).
    on_a = engine_a.load_topic(topic)
    assert [on_a.append(make_msg(i, topic.broker_name)) for i in range(22)] == list(range(22))
    cursor = on_a.subscription_cursor("subs_reliable")
    for offset in range(14):
        cursor.ack(offset)
    assert metadata.get(cursor_key) is None

    # T4: unload on A.
    wal_dir_a = on_a.wal.directory
    state = engine_a.unload_topic(topic)
    raw_state = metadata.get(state_key)
    assert raw_state == (
        f'{{"broker_id":{BROKER_A},"last_committed_offset":21,"sealed":true,"timestamp":{state.timestamp}}}'
    ).encode()
    assert json.loads(raw_state)["broker_id"] == BROKER_A
    assert_wal_kept(wal_dir_a, topic, range(22))
    assert metadata.get(cursor_key) == b"13"
    first = check_descriptor(metadata.get(objects + "00000000000000000000"), 0, 21)
    assert engine_a.get(topic) is None
    with pytest.raises(TopicClosedError):
        on_a.append(make_msg(99, topic.broker_name))

    # T5: B loads at 22 and deletes the marker.
    on_b = engine_b.load_topic(topic)
    assert on_b.next_offset == 22
    assert metadata.get(state_key) is None
    seeded = read_checkpoint(os.path.join(on_b.wal.directory, "uploader.ckpt"), UploaderCheckpoint)
    assert seeded.last_committed_offset == 21

    # T6: 22..27 on B.
    assert [on_b.append(make_msg(i, topic.broker_name)) for i in range(22, 28)] == list(range(22, 28))

    # T8-T9: the consumer resumes at cursor + 1: 14..21 from the object, 22..27 from B's WAL.
    resume = on_b.subscription_cursor("subs_reliable").resume_offset()
    assert resume == 14
    got = list(on_b.reader(resume))
    assert [m.msg_id.topic_offset for m in got] == list(range(14, 28))
    assert [m.payload for m in got] == [make_msg(i, topic.broker_name).payload for i in range(14, 28)]

    # T7: B uploads 22..27; the keys are those of the spec.
    on_b.uploader.drain()
    keys = storage_keys(metadata, topic)
    assert sorted(keys) == [objects + "00000000000000000000", objects + "00000000000000000022", objects + "cur"]
    assert check_descriptor(keys[objects + "00000000000000000000"], 0, 21) == first
    check_descriptor(keys[objects + "00000000000000000022"], 22, 27)
    assert keys[objects + "cur"] == b'{"start":"00000000000000000022"}'
    assert metadata.get(cursor_key) == b"13"


def test_a_crashed_owner_is_followed_after_its_descriptors_not_at_zero(make_engine, metadata, topic):
    engine_a, engine_b = make_engine("a", BROKER_A), make_engine("b", BROKER_B)
    on_a = engine_a.load_topic(topic)
    append_messages(on_a, topic.broker_name, range(10))
    on_a.uploader.drain()
    engine_a.close()  # a crash: no sealed state, A's WAL stays on A's disk
    assert metadata.get(f"{ROOT}/storage/topics/{topic.storage_path}/state") is None

    on_b = engine_b.load_topic(topic)
    assert on_b.next_offset == 10
    assert on_b.append(make_msg(10, topic.broker_name)) == 10
    assert [m.msg_id.topic_offset for m in on_b.reader(0)] == list(range(11))
    on_b.uploader.drain()
    starts = [k.rsplit("/", 1)[1] for k in storage_keys(metadata, topic)]
    assert starts == ["00000000000000000000", "00000000000000000010", "cur"]


def test_unloading_a_topic_that_never_got_a_message_writes_no_marker(make_engine, metadata, topic):
    engine_a, engine_b = make_engine("a", BROKER_A), make_engine("b", BROKER_B)
    engine_a.load_topic(topic)
    assert engine_a.unload_topic(topic) is None
    assert storage_keys(metadata, topic) == {}
    assert engine_b.load_topic(topic).next_offset == 0


def test_moving_back_and_forth_keeps_the_offsets_continuous(make_engine, metadata, topic):
    engine_a, engine_b = make_engine("a", BROKER_A), make_engine("b", BROKER_B)
    engine_a.load_topic(topic).append(make_msg(0, topic.broker_name))
    engine_a.unload_topic(topic)
    assert engine_b.load_topic(topic).next_offset == 1  # nothing appended on B before it moves back
    assert engine_b.unload_topic(topic).last_committed_offset == 0
    on_a = engine_a.load_topic(topic)
    assert on_a.append(make_msg(1, topic.broker_name)) == 1
    assert [m.msg_id.topic_offset for m in on_a.reader(0)] == [0, 1]


def test_a_topic_moving_back_to_a_broker_that_kept_its_wal_continues_after_the_other_owner(
        make_engine, metadata, topic):
    """A keeps 0..4 on disk after its unload; B serves 5..9; back on A, the new frames go after
    B's offsets, A's kept uploader.ckpt resumes behind its old files (nothing re-uploaded),
    and 5..9 are B's messages from the objects, not anything from A's disk."""
    engine_a, engine_b = make_engine("a", BROKER_A), make_engine("b", BROKER_B)
    on_a = engine_a.load_topic(topic)
    append_messages(on_a, topic.broker_name, range(5))
    wal_dir_a = on_a.wal.directory
    engine_a.unload_topic(topic)
    assert_wal_kept(wal_dir_a, topic, range(5))
    on_b = engine_b.load_topic(topic)
    for i in range(5, 10):
        assert on_b.append(make_msg(i, topic.broker_name)) == i
    engine_b.unload_topic(topic)

    again = engine_a.load_topic(topic)
    assert again.next_offset == 10
    for i in range(10, 13):
        assert again.append(make_msg(i, topic.broker_name)) == i
    again.uploader.drain()
    spans = [(d.start_offset, d.end_offset) for d in (
        ObjectDescriptor.from_json(raw, key) for key, raw in storage_keys(metadata, topic).items()
        if "/objects/0" in key)]
    assert spans == [(0, 4), (5, 9), (10, 12)]
    got = list(again.reader(0))
    assert [m.msg_id.topic_offset for m in got] == list(range(13))
    assert [m.payload for m in got] == [make_msg(i, topic.broker_name).payload for i in range(13)]


def test_brokers_sharing_one_wal_directory_hand_over_through_the_kept_files(
        make_engine, metadata, topic):
    """Danube's CI runs its brokers on one host with one config: the same topic directory.
    B finds A's kept files and checkpoints there, continues at 22 in a new segment, and its
    uploader resumes from A's uploader.ckpt instead of uploading 0..21 a second time."""
    engine_a, engine_b = make_engine("shared", BROKER_A), make_engine("shared", BROKER_B)
    on_a = engine_a.load_topic(topic)
    append_messages(on_a, topic.broker_name, range(22))
    engine_a.unload_topic(topic)
    assert_wal_kept(on_a.wal.directory, topic, range(22))

    on_b = engine_b.load_topic(topic)
    assert on_b.wal.directory == on_a.wal.directory
    assert on_b.next_offset == 22
    for i in range(22, 28):
        assert on_b.append(make_msg(i, topic.broker_name)) == i
    on_b.uploader.drain()
    starts = [k.rsplit("/", 1)[1] for k in storage_keys(metadata, topic)]
    assert starts == ["00000000000000000000", "00000000000000000022", "cur"]
    got = list(on_b.reader(0))
    assert [m.msg_id.topic_offset for m in got] == list(range(28))
    assert [m.payload for m in got] == [make_msg(i, topic.broker_name).payload for i in range(28)]


def test_delete_removes_storage_keys_and_cursors(make_engine, metadata, topic):
    engine_a = make_engine("a", BROKER_A)
    on_a = engine_a.load_topic(topic)
    on_a.append(make_msg(0, topic.broker_name))
    on_a.uploader.drain()
    cursor = on_a.subscription_cursor("subs_reliable")
    cursor.ack(0)
    cursor.flush()
    subscription_key = f"/topics/{topic.storage_path}/subscriptions/subs_reliable"
    metadata.put(subscription_key, b'{"consumer_id":null,"consumer_name":"c","subscription_name":"subs_reliable",'
                                    b'"subscription_type":0}')
    wal_dir = on_a.wal.directory
    engine_a.delete_topic(topic)
    assert storage_keys(metadata, topic) == {}
    assert metadata.get(subscription_key + "/cursor") is None
    assert metadata.get(subscription_key) is not None  # the subscription record is the broker's to remove
    assert not os.path.exists(wal_dir)


def test_a_restarted_owner_uploads_what_its_local_wal_still_holds(make_engine, metadata, topic):
    engine = make_engine("a", BROKER_A)
    on_a = engine.load_topic(topic)
    append_messages(on_a, topic.broker_name, range(10))
    on_a.uploader.drain()
    append_messages(on_a, topic.broker_name, range(10, 15))
    engine.close()  # 10..14 reach the local WAL, not the cloud

    again = make_engine("a", BROKER_A).load_topic(topic)
    assert again.next_offset == 15
    again.uploader.drain()
    spans = [(d.start_offset, d.end_offset) for d in (
        ObjectDescriptor.from_json(raw, key) for key, raw in storage_keys(metadata, topic).items()
        if "/objects/0" in key)]
    assert spans == [(0, 9), (10, 14)]
    assert [m.msg_id.topic_offset for m in again.reader(0)] == list(range(15))


def test_storage_settings_name_the_bad_option():
    wal = WalConfig(root="/tmp/unused")
    with pytest.raises(ConfigError, match="max_object_bytes=0"):
        StorageSettings(wal=wal, cloud_url="/tmp/cloud", max_object_bytes=0)
    with pytest.raises(ConfigError, match="uploader_interval_s"):
        StorageSettings(wal=wal, cloud_url="/tmp/cloud", uploader_interval_s=0)


def test_a_stale_local_wal_never_shadows_a_later_owners_objects(make_engine, metadata, topic):
    """A crashes with 10..14 only on its disk; B takes over at 10 and uploads its own 10..12;
    when A comes back its old local 10..12 must not be served in place of B's."""
    engine_a, engine_b = make_engine("a", BROKER_A), make_engine("b", BROKER_B)
    on_a = engine_a.load_topic(topic)
    append_messages(on_a, topic.broker_name, range(10))
    on_a.uploader.drain()
    append_messages(on_a, topic.broker_name, range(10, 15))
    engine_a.close()

    on_b = engine_b.load_topic(topic)
    for i in range(10, 13):
        assert on_b.append(make_msg(100 + i, topic.broker_name)) == i
    on_b.uploader.drain()
    engine_b.close()

    again = make_engine("a", BROKER_A).load_topic(topic)
    assert again.next_offset == 15  # its local WAL still holds (stale) offsets up to 14
    payloads = {m.msg_id.topic_offset: m.payload for m in again.reader(0)}
    assert [payloads[i] for i in range(10, 13)] == [make_msg(100 + i, topic.broker_name).payload
                                                    for i in range(10, 13)]
    assert sorted(payloads) == list(range(15))
