"""The tiered reader against a real etcd and local-file objects: objects → WAL → live appends,
index seeks, strict CRC, and DataLossError for every kind of hole (never a silent skip)."""

from __future__ import annotations

import threading

import pytest

from broker.tiered_reader import TieredReader
from danube_core.descriptor_catalog import DescriptorCatalog
from broker.uploader import Uploader
from broker.wal import Wal, WalConfig
from danube_core.errors import CorruptFrameError, DataLossError
from danube_core.keys import StorageKeys
from danube_core.objectstore import ObjectStore
from danube_core.records import ObjectDescriptor
from danube_core.topics import TopicName
from tests.rig import eventually
from tests.unit.test_uploader import FakeClock, make_msg

NEVER_MS = 3_600_000


class RecordingStore(ObjectStore):
    """An ObjectStore that remembers every ranged read (path, start)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.reads: list[tuple[str, int]] = []

    def read_range(self, path_or_url: str, start: int, end: int) -> bytes:
        self.reads.append((path_or_url, start))
        return super().read_range(path_or_url, start, end)


@pytest.fixture
def store(tmp_path) -> RecordingStore:
    return RecordingStore(f"file://{tmp_path}/cloud")


@pytest.fixture
def topic(unique_name) -> TopicName:
    return TopicName("default", unique_name("tiered"))


def open_wal(tmp_path, topic: TopicName, initial_offset: int | None = None, name: str = "wal") -> Wal:
    config = WalConfig(root=str(tmp_path / name), fsync_interval_ms=NEVER_MS, durable=False)
    return Wal.open(topic, config, initial_offset=initial_offset)


def publish(wal: Wal, topic: TopicName, offsets: range) -> None:
    for i in offsets:
        assert wal.append(make_msg(i, topic.broker_name)) == i


def upload_in_objects(wal: Wal, topic, store, metadata, spans: list[range]) -> None:
    """Append and upload so that each span becomes one object."""
    uploader = Uploader(topic, wal, store, metadata, StorageKeys(), clock=FakeClock(), durable=False)
    for span in spans:
        publish(wal, topic, span)
        wal.flush()
        uploader.run_cycle()


def offsets_of(messages) -> list[int]:
    return [m.msg_id.topic_offset for m in messages]


def test_objects_then_a_new_wal_then_live_appends_exactly_once(tmp_path, topic, store, metadata):
    keys = StorageKeys()
    with open_wal(tmp_path, topic, name="old") as old:  # the previous owner's WAL, now gone
        upload_in_objects(old, topic, store, metadata, [range(0, 10), range(10, 25), range(25, 30)])
    with open_wal(tmp_path, topic, initial_offset=30) as wal:
        publish(wal, topic, range(30, 34))  # still only in memory
        reader = TieredReader(topic, metadata, keys, store, wal)
        got = list(reader.read(12))
        assert offsets_of(got) == list(range(12, 34))
        assert [m.payload for m in got] == [make_msg(i, topic.broker_name).payload for i in range(12, 34)]

        stop = threading.Event()
        seen: list[int] = []

        def follow() -> None:
            for msg in reader.read(28, follow=True, stop_event=stop):
                seen.append(msg.msg_id.topic_offset)

        follower = threading.Thread(target=follow)
        follower.start()
        eventually(lambda: seen == list(range(28, 34)), 10)
        publish(wal, topic, range(34, 37))
        eventually(lambda: seen == list(range(28, 37)), 10)
        stop.set()
        follower.join(10)
        assert not follower.is_alive()


def test_seek_starts_at_the_last_index_entry_at_or_before_the_offset(tmp_path, topic, store, metadata):
    with open_wal(tmp_path, topic) as wal:
        upload_in_objects(wal, topic, store, metadata, [range(0, 2500)])
        descriptor = DescriptorCatalog(metadata, StorageKeys(), topic).get(0)
        store.reads.clear()
        got = offsets_of(TieredReader(topic, metadata, StorageKeys(), store, None).read(2345))
    assert got == list(range(2345, 2500))
    assert store.reads[0][1] == dict(descriptor.offset_index)[2000]


def test_a_hole_between_objects_is_data_loss_not_a_skip(tmp_path, topic, store, metadata):
    keys = StorageKeys()
    with open_wal(tmp_path, topic) as wal:
        upload_in_objects(wal, topic, store, metadata, [range(0, 5), range(5, 10), range(10, 15)])
    metadata.delete(keys.object_key(topic, 5))
    reader = TieredReader(topic, metadata, keys, store, None)
    received: list[int] = []
    with pytest.raises(DataLossError) as info:
        for msg in reader.read(3):
            received.append(msg.msg_id.topic_offset)
    assert received == [3, 4]
    message = str(info.value)
    assert str(topic) in message and "offsets 5..9" in message and "data-10-" in message
    assert "nearest object data-0-" in message and "offsets 0..4" in message


def test_a_hole_between_the_last_object_and_the_wal_is_data_loss(tmp_path, topic, store, metadata):
    with open_wal(tmp_path, topic, name="old") as old:
        upload_in_objects(old, topic, store, metadata, [range(0, 8)])
    with open_wal(tmp_path, topic, initial_offset=12) as wal:  # 8..11 were never uploaded
        publish(wal, topic, range(12, 14))
        reader = TieredReader(topic, metadata, StorageKeys(), store, wal)
        received: list[int] = []
        with pytest.raises(DataLossError, match=r"offsets 8\.\.11 .*local WAL starts at 12.*data-0-"):
            for msg in reader.read(6):
                received.append(msg.msg_id.topic_offset)
    assert received == [6, 7]


def test_a_corrupt_object_frame_fails_naming_object_and_byte(tmp_path, topic, store, metadata):
    with open_wal(tmp_path, topic) as wal:
        upload_in_objects(wal, topic, store, metadata, [range(0, 6)])
    descriptor = DescriptorCatalog(metadata, StorageKeys(), topic).get(0)
    path = store.object_path(topic, descriptor.object_id)
    data = bytearray(store.read_range(path, 0, store.size(path)))
    frame_len = len(data) // 6  # all six frames have the same size
    data[4 * frame_len + 20] ^= 0xFF
    with open(path, "wb") as fh:
        fh.write(data)
    with pytest.raises(CorruptFrameError) as info:
        list(TieredReader(topic, metadata, StorageKeys(), store, None).read(1))
    assert info.value.offset == 4 and info.value.byte_pos == 4 * frame_len
    assert descriptor.object_id in info.value.source


def test_a_missing_object_is_data_loss(tmp_path, topic, store, metadata):
    with open_wal(tmp_path, topic) as wal:
        upload_in_objects(wal, topic, store, metadata, [range(0, 3)])
    descriptor = DescriptorCatalog(metadata, StorageKeys(), topic).get(0)
    store.delete(store.object_path(topic, descriptor.object_id))
    with pytest.raises(DataLossError, match=r"offsets 0\.\.2 .*missing"):
        list(TieredReader(topic, metadata, StorageKeys(), store, None).read(0))


def test_catalog_finds_the_covering_descriptor_without_scanning_history(topic, metadata):
    keys = StorageKeys()
    for start in range(0, 3000, 10):
        descriptor = ObjectDescriptor(f"data-{start}-1.dnb1", start, start + 9, 1, None, 1, True, [(start, 0)])
        metadata.put(keys.object_key(topic, start), descriptor.to_json())
    metadata.put(keys.cur_key(topic), b'{"start":"00000000000000002990"}')

    class Counting:
        def __init__(self, inner):
            self.inner, self.rows = inner, 0

        def get(self, key):
            return self.inner.get(key)

        def get_range(self, start, end, limit=None):
            rows = self.inner.get_range(start, end, limit)
            self.rows += len(rows)
            return rows

    counting = Counting(metadata)
    catalog = DescriptorCatalog(counting, keys, topic)
    for offset, start in [(0, 0), (9, 0), (1234, 1230), (2995, 2990), (10**6, 2990)]:
        counting.rows = 0
        assert catalog.at_or_before(offset).start_offset == start
        assert counting.rows <= 64, f"at_or_before({offset}) read {counting.rows} rows"
    assert catalog.last().start_offset == 2990
