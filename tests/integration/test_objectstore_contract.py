"""The object store contract, written once and run against local files, S3 (moto) and memory.

Also pins the object naming of spec §4.2 and the backend error table.
"""

from __future__ import annotations

import inspect

import errno
import pickle
from typing import Iterator

import pytest

from danube_core.errors import ConfigError, ObjectMissingError, ObjectStoreError
from danube_core.objectstore import (
    WRITE_BLOCK_SIZE,
    ObjectStore,
    object_id_for,
    objects_dir,
    parse_object_id,
    translate_error,
)
from danube_core.topics import TopicName

DATA = bytes(range(256)) * 40  # 10240 bytes, every byte value, position-dependent


class ObjectStoreContract:
    """Subclasses provide `store` (and `storage_options`); every test must hold for each backend."""

    gives_etag = False

    @pytest.fixture
    def topic(self, unique_name) -> TopicName:
        return TopicName("default", unique_name("orders"))

    def write(self, store: ObjectStore, topic: TopicName, object_id: str, data: bytes):
        with store.open_writer(topic, object_id) as writer:
            for i in range(0, len(data), 4096):
                writer.write(data[i:i + 4096])
        return writer

    def test_write_then_read_back(self, store: ObjectStore, topic: TopicName):
        object_id = object_id_for(0, 1700000030)
        writer = self.write(store, topic, object_id, DATA)
        path = store.object_path(topic, object_id)
        assert writer.size == len(DATA)
        assert (writer.etag is not None) == self.gives_etag
        assert path.endswith(f"storage/topics/default/{topic.topic}/objects/data-0-1700000030.dnb1")
        assert store.exists(path)
        assert store.size(path) == len(DATA)
        assert store.read_range(path, 0, len(DATA)) == DATA

    def test_ranged_reads(self, store: ObjectStore, topic: TopicName):
        object_id = object_id_for(1204, 1700000061)
        self.write(store, topic, object_id, DATA)
        path = store.object_path(topic, object_id)
        assert store.read_range(path, 0, 16) == DATA[:16]
        assert store.read_range(path, 16, 111) == DATA[16:111]
        assert store.read_range(path, 10000, 10240) == DATA[10000:]
        assert store.read_range(path, 10000, 99999) == DATA[10000:]  # short at the end
        assert store.read_range(path, 500, 500) == b""
        with pytest.raises(ValueError, match="start <= end"):
            store.read_range(path, 10, 5)

    def test_streaming_reader_from_a_start_byte(self, store: ObjectStore, topic: TopicName):
        object_id = object_id_for(7, 1700000000)
        self.write(store, topic, object_id, DATA)
        path = store.object_path(topic, object_id)
        with store.open_reader(path, start=100, block_size=1000) as reader:
            assert reader.read(300) == DATA[100:400]
            assert reader.tell() == 400
            assert reader.read(2500) == DATA[400:2900]
            assert reader.read() == DATA[2900:]
            assert reader.read(10) == b""

    def test_missing_object_is_object_missing_error_naming_the_url(self, store: ObjectStore, topic):
        object_id = object_id_for(42, 1700000000)
        url = store.object_url(topic, object_id)
        path = store.object_path(topic, object_id)
        assert not store.exists(path)
        for read in (
            lambda: store.read_range(url, 0, 10), lambda: store.size(path), lambda: store.open_reader(url)
        ):
            with pytest.raises(ObjectMissingError) as raised:
                read()
            assert path in str(raised.value) and not raised.value.retriable
            assert raised.value.__cause__ is not None
        store.delete(path)  # deleting what is already gone is not an error

    def test_listing_is_by_start_offset_and_ignores_other_names(self, store: ObjectStore, topic, unique_name):
        ids = [object_id_for(start, 1700000000 + start) for start in (200, 0, 1000)]
        for object_id in ids:
            self.write(store, topic, object_id, b"frame bytes")
        directory = store.object_path(topic, ids[0]).rsplit("/", 1)[0]
        store.fs.pipe_file(directory + "/notes.txt", b"not an object")
        assert store.list_objects(topic) == [ids[1], ids[0], ids[2]]
        assert store.list_objects(TopicName("default", unique_name("empty"))) == []
        store.delete(store.object_path(topic, ids[0]))
        assert store.list_objects(topic) == [ids[1], ids[2]]

    def test_a_bounded_listing_returns_the_starts_in_range_asking_only_their_prefixes(
            self, store: ObjectStore, topic, monkeypatch):
        starts = (5, 95, 99_990, 99_999, 100_000, 100_004, 100_020, 123_456, 1_000_007)
        ids = {start: object_id_for(start, 1700000000 + start) for start in starts}
        for object_id in ids.values():
            self.write(store, topic, object_id, b"frame bytes")
        asked: list[str] = []
        find = store.fs.find
        if "prefix" in inspect.signature(find).parameters:
            def spying_find(path, prefix="", **kw):
                asked.append(prefix)
                return find(path, prefix=prefix, **kw)
            monkeypatch.setattr(store.fs, "find", spying_find)
        assert store.list_objects(topic, 99_990, 100_010) == [ids[s] for s in (99_990, 99_999, 100_000, 100_004)]
        assert store.list_objects(topic, 123_456, 123_456) == [ids[123_456]]
        assert store.list_objects(topic, 100_000) == [ids[s] for s in starts if s >= 100_000]
        if "prefix" in inspect.signature(find).parameters:  # S3: names asked for by prefix
            assert asked == ["data-9999", "data-1000", "data-123456"]

    def test_object_url_reopens_through_a_pickled_fresh_store(self, store: ObjectStore, topic):
        object_id = object_id_for(300, 1700000000)
        self.write(store, topic, object_id, DATA)
        url = store.object_url(topic, object_id)
        assert url.startswith(store.url.split("://", 1)[0] + "://")
        fresh = ObjectStore.from_url(store.url, store.storage_options)
        executor_store = pickle.loads(pickle.dumps(fresh))
        assert executor_store.read_range(url, 95, 190) == DATA[95:190]
        from_object_url = pickle.loads(pickle.dumps(ObjectStore.from_url(url, store.storage_options)))
        assert from_object_url.size(url) == len(DATA)

    def test_failed_write_leaves_no_object_under_the_final_name(self, store: ObjectStore, topic):
        object_id = object_id_for(500, 1700000000)
        big = DATA * (WRITE_BLOCK_SIZE // len(DATA) + 10)  # more than one multipart part
        with pytest.raises(RuntimeError, match="crash mid-upload"):
            with store.open_writer(topic, object_id) as writer:
                writer.write(big)
                raise RuntimeError("crash mid-upload")
        path = store.object_path(topic, object_id)
        assert not store.exists(path)
        assert store.list_objects(topic) == []
        directory = path.rsplit("/", 1)[0]
        leftovers = store.fs.ls(directory, detail=False) if store.fs.exists(directory) else []
        assert leftovers == []

    def test_large_object_round_trip(self, store: ObjectStore, topic: TopicName):
        object_id = object_id_for(600, 1700000000)
        big = DATA * (WRITE_BLOCK_SIZE // len(DATA) + 10)
        writer = self.write(store, topic, object_id, big)
        path = store.object_path(topic, object_id)
        assert writer.size == len(big) == store.size(path)
        across_parts = (WRITE_BLOCK_SIZE - 5, WRITE_BLOCK_SIZE + 5)
        assert store.read_range(path, *across_parts) == big[across_parts[0]:across_parts[1]]

    def test_url_of_another_protocol_is_refused(self, store: ObjectStore):
        other = "gs://elsewhere/x" if not store.url.startswith("gs") else "file:///x"
        with pytest.raises(ValueError, match="not on this store"):
            store.read_range(other, 0, 1)


class TestLocalObjectStore(ObjectStoreContract):
    @pytest.fixture
    def store(self, tmp_path) -> ObjectStore:
        return ObjectStore(f"file://{tmp_path}/cloud")

    def test_object_lands_under_the_root_without_root_prefix(self, tmp_path, topic: TopicName):
        store = ObjectStore(str(tmp_path / "cloud"))
        self.write(store, topic, object_id_for(0, 1), b"x")
        assert (tmp_path / "cloud" / objects_dir(topic) / "data-0-1.dnb1").read_bytes() == b"x"

    def test_relative_root_is_resolved_once_against_the_working_directory(self, tmp_path, monkeypatch):
        monkeypatch.chdir(tmp_path)
        store = ObjectStore("./danube-data/cloud-storage")
        assert store.url == f"file://{tmp_path}/danube-data/cloud-storage"
        assert pickle.loads(pickle.dumps(store)).url == store.url


class TestS3ObjectStore(ObjectStoreContract):
    gives_etag = True

    @pytest.fixture
    def store(self, moto_s3, s3_bucket) -> ObjectStore:
        return ObjectStore(f"s3://{s3_bucket}/danube", moto_s3.storage_options)

    def test_object_key_is_prefix_then_storage_path(self, store: ObjectStore, topic, s3_bucket: str):
        self.write(store, topic, object_id_for(0, 1), b"x")
        expected = f"s3://{s3_bucket}/danube/{objects_dir(topic)}/data-0-1.dnb1"
        assert store.object_url(topic, "data-0-1.dnb1") == expected


class TestMemoryObjectStore(ObjectStoreContract):
    @pytest.fixture
    def store(self, unique_name) -> Iterator[ObjectStore]:
        store = ObjectStore(f"memory://{unique_name('mem')}")
        yield store
        if store.fs.exists(store.url):
            store.fs.rm(store.url, recursive=True)


def test_object_id_round_trip_and_spec_examples():
    assert object_id_for(0, 1700000030) == "data-0-1700000030.dnb1"
    assert object_id_for(1204, 1700000061) == "data-1204-1700000061.dnb1"
    assert parse_object_id("data-1204-1700000061.dnb1") == (1204, 1700000061)
    assert parse_object_id(object_id_for(2**64 - 1, 0)) == (2**64 - 1, 0)


@pytest.mark.parametrize(
    "bad", ["data-01-5.dnb1", "data-1-5.dnb", "data--1-5.dnb1", "00000000000000001204", "data-1-x.dnb1"]
)
def test_malformed_object_ids_are_refused(bad: str):
    with pytest.raises(ValueError, match="expected data-"):
        parse_object_id(bad)


@pytest.mark.parametrize("start, secs", [(-1, 0), (0, -1), (2**64, 0), (True, 0)])
def test_object_id_parts_must_be_u64(start, secs):
    with pytest.raises(ValueError, match="0..2"):
        object_id_for(start, secs)


def test_unknown_scheme_is_a_config_error():
    with pytest.raises(ConfigError, match="nosuchproto://x"):
        ObjectStore("nosuchproto://x")


class _FakeBotocoreError(Exception):
    pass


class EndpointConnectionError(_FakeBotocoreError):
    """Same class name as botocore's: the table matches by name, without importing botocore."""


class NoCredentialsError(_FakeBotocoreError):
    pass


@pytest.mark.parametrize(
    "error, kind, retriable",
    [
        (FileNotFoundError("NoSuchKey"), ObjectMissingError, False),
        (PermissionError("AccessDenied"), ObjectStoreError, False),
        (NoCredentialsError("Unable to locate credentials"), ObjectStoreError, False),
        (EndpointConnectionError("Could not connect"), ObjectStoreError, True),
        (TimeoutError("read timed out"), ObjectStoreError, True),
        (ConnectionResetError("reset"), ObjectStoreError, True),
        (OSError(errno.EBUSY, "SlowDown"), ObjectStoreError, True),
        (OSError(errno.EIO, "InternalError"), ObjectStoreError, True),
        (OSError(errno.EINVAL, "InvalidRange"), ObjectStoreError, False),
        (ValueError("something else"), ObjectStoreError, False),
    ],
)
def test_error_table(error: Exception, kind: type, retriable: bool):
    url = "s3://bucket/storage/topics/ns/t/objects/data-0-1.dnb1"
    translated = translate_error(error, url, "read_range")
    assert type(translated) is kind
    assert translated.retriable is retriable
    assert url in str(translated)
    assert pickle.loads(pickle.dumps(translated)).retriable is retriable
