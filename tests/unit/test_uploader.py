"""The uploader: objects, descriptors, `cur`, `uploader.ckpt`, resume and crash safety.

`UploaderContract` is written once and run against every backend pair: here the in-memory
metadata store with a `memory://` object store; `tests/integration/test_uploader_backends.py`
runs it against a real etcd with `file://` and moto `s3://`.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass

import pytest

import broker.uploader as uploader_module
from broker.uploader import INDEX_EVERY_FRAMES, ORPHAN_GRACE_S, Uploader
from broker.wal import Wal, WalConfig
from danube_core.checkpoints import UploaderCheckpoint, read_checkpoint
from danube_core.errors import CheckpointError, CorruptFrameError, MetadataError
from danube_core.frames import FRAME_HEADER_SIZE, scan_frames
from danube_core.keys import StorageKeys
from danube_core.message import MessageID, StreamMessage
from danube_core.metadata import MetadataStore
from danube_core.metadata_memory import MemoryMetadataStore
from danube_core.objectstore import ObjectStore
from danube_core.records import ObjectDescriptor
from danube_core.topics import TopicName
from tests.rig import eventually

NEVER_MS = 3_600_000
T0 = 1_700_000_000


def append_messages(wal, topic: str, offsets: range) -> None:
    """Append `make_msg(i, topic)` for every i of `offsets` (the WAL gives them its own offsets)."""
    for i in offsets:
        wal.append(make_msg(i, topic))


def make_msg(i: int, topic: str, size: int = 0) -> StreamMessage:
    return StreamMessage(
        request_id=i,
        msg_id=MessageID(producer_id=7, topic_name=topic, broker_addr="http://127.0.0.1:6650/", topic_offset=0),
        payload=f"message-{i}".encode() + b"x" * size,
        publish_time=1_700_000_000_000 + i,
        producer_name="p1",
        attributes={"k": str(i)},
    )


class FakeClock:
    """Unix seconds that tests move by hand."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class Backend:
    store: ObjectStore
    metadata: MetadataStore
    keys: StorageKeys
    wal_root: str


class FailingOnce:
    """Wraps a metadata store; the named method raises MetadataError on its next call only."""

    def __init__(self, inner: MetadataStore, method: str) -> None:
        self._inner = inner
        self._method = method
        self.armed = True

    def __getattr__(self, name: str):
        attr = getattr(self._inner, name)
        if name == self._method and self.armed:
            def fail(*args, **kwargs):
                self.armed = False
                raise MetadataError(f"injected failure of {name}{args[:1]}")
            return fail
        return attr


def wal_bytes(wal: Wal) -> bytes:
    data = b""
    for seg in wal.segments():
        with open(seg.path, "rb") as fh:
            data += fh.read()
    return data


def frame_sizes(data: bytes) -> list[int]:
    return [f.end_pos - f.frame_pos for f in scan_frames(data).frames]


class _ListingHook:
    """An object store whose `list_objects` is replaced (everything else passes through)."""

    def __init__(self, inner: ObjectStore, list_objects) -> None:
        self._inner = inner
        self.list_objects = list_objects

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


class UploaderContract:
    """Behaviour every (object store, metadata store) pair must show. Needs a `backend` fixture."""

    @pytest.fixture
    def topic(self, unique_name) -> TopicName:
        return TopicName("default", unique_name("up").replace("-", "_"))

    def open_wal(self, backend: Backend, topic: TopicName, **overrides) -> Wal:
        config = WalConfig(root=backend.wal_root, fsync_interval_ms=NEVER_MS, durable=False, **overrides)
        return Wal.open(topic, config)

    def uploader(self, backend: Backend, topic: TopicName, wal: Wal, clock=None, metadata=None, **kw) -> Uploader:
        return Uploader(topic, wal, backend.store, metadata or backend.metadata, backend.keys,
                        clock=clock or FakeClock(), durable=False, **kw)

    def descriptors(self, backend: Backend, topic: TopicName) -> list[ObjectDescriptor]:
        prefix = backend.keys.objects_prefix(topic)
        return [ObjectDescriptor.from_json(raw, key) for key, raw in backend.metadata.get_prefix(prefix)
                if not key.endswith("/cur")]

    def object_bytes(self, backend: Backend, topic: TopicName, object_id: str) -> bytes:
        path = backend.store.object_path(topic, object_id)
        return backend.store.read_range(path, 0, backend.store.size(path))

    def test_descriptor_cur_object_and_checkpoint_are_exactly_the_spec(self, backend, topic):
        with self.open_wal(backend, topic) as wal:
            append_messages(wal, topic.broker_name, range(2500))
            wal.flush()
            descriptor = self.uploader(backend, topic, wal).run_cycle()
            frames = wal_bytes(wal)
            ckpt = read_checkpoint(os.path.join(wal.directory, "uploader.ckpt"), UploaderCheckpoint)
        sizes = frame_sizes(frames)
        assert descriptor.object_id == f"data-0-{T0}.dnb1"
        assert self.object_bytes(backend, topic, descriptor.object_id) == frames
        root = backend.keys.root_prefix
        key = f"{root}/storage/topics/{topic.storage_path}/objects/00000000000000000000"
        expected_index = [[0, 0], [1000, sum(sizes[:1000])], [2000, sum(sizes[:2000])]]
        expected = (
            f'{{"completed":true,"created_at":{T0},"end_offset":2499,"etag":{json.dumps(descriptor.etag)},'
            f'"object_id":"data-0-{T0}.dnb1","offset_index":{json.dumps(expected_index, separators=(",", ":"))},'
            f'"size":{len(frames)},"start_offset":0}}'
        )
        assert backend.metadata.get(key).decode() == expected
        cur = f"{root}/storage/topics/{topic.storage_path}/objects/cur"
        assert backend.metadata.get(cur) == b'{"start":"00000000000000000000"}'
        assert ckpt == UploaderCheckpoint(2499, 0, len(frames), f"data-0-{T0}.dnb1", T0)

    def test_resumes_exactly_where_it_stopped_across_restarts(self, backend, topic):
        clock = FakeClock()
        wal = self.open_wal(backend, topic)
        append_messages(wal, topic.broker_name, range(10))
        wal.flush()
        assert self.uploader(backend, topic, wal, clock).run_cycle().end_offset == 9
        append_messages(wal, topic.broker_name, range(10, 15))
        wal.flush()
        clock.now += 30
        second = self.uploader(backend, topic, wal, clock).run_cycle()  # a restarted uploader
        assert (second.start_offset, second.end_offset) == (10, 14)
        wal.close()
        wal = self.open_wal(backend, topic)  # a restarted WAL writes a new segment
        append_messages(wal, topic.broker_name, range(15, 18))
        wal.flush()
        clock.now += 30
        uploader = self.uploader(backend, topic, wal, clock)
        third = uploader.run_cycle()
        assert (third.start_offset, third.end_offset) == (15, 17)
        assert uploader.run_cycle() is None
        everything = b"".join(self.object_bytes(backend, topic, d.object_id) for d in (
            self.descriptors(backend, topic)))
        assert everything == wal_bytes(wal)
        assert [(d.start_offset, d.end_offset) for d in self.descriptors(backend, topic)] == [
            (0, 9), (10, 14), (15, 17)]
        wal.close()

    def test_half_written_trailing_frame_is_uploaded_on_the_next_cycle(self, backend, topic):
        with self.open_wal(backend, topic) as wal:
            append_messages(wal, topic.broker_name, range(5))
            wal.flush()
            complete = wal_bytes(wal)
            wal.append(make_msg(5, topic.broker_name))
            wal.flush()
            frame5 = wal_bytes(wal)[len(complete):]
            active = wal.segments()[-1].path
            with open(active, "r+b") as fh:  # the writer got only 10 bytes of frame 5 out so far
                fh.truncate(len(complete) + 10)
            uploader = self.uploader(backend, topic, wal)
            first = uploader.run_cycle()
            assert (first.start_offset, first.end_offset) == (0, 4)
            assert uploader.run_cycle() is None
            with open(active, "ab") as fh:
                fh.write(frame5[10:])
            second = uploader.run_cycle()
        assert (second.start_offset, second.end_offset) == (5, 5)
        assert self.object_bytes(backend, topic, second.object_id) == frame5

    def crash_before_the_descriptor_put(self, backend: Backend, topic: TopicName, wal: Wal, clock: FakeClock,
                                        offsets: range) -> None:
        """Append `offsets` and upload them with the descriptor's put failing, as a broker killed
        between the two would leave them."""
        append_messages(wal, topic.broker_name, offsets)
        wal.flush()
        with pytest.raises(MetadataError, match="injected"):
            self.uploader(backend, topic, wal, clock, metadata=FailingOnce(backend.metadata, "put_if_absent")).run_cycle()

    def test_crash_before_the_descriptor_put_leaves_no_gap_and_no_orphan(self, backend, topic):
        clock = FakeClock()
        with self.open_wal(backend, topic) as wal:
            append_messages(wal, topic.broker_name, range(5))
            wal.flush()
            self.uploader(backend, topic, wal, clock).run_cycle()
            self.crash_before_the_descriptor_put(backend, topic, wal, clock, range(5, 10))
            assert backend.store.list_objects(topic) == [f"data-0-{T0}.dnb1", f"data-5-{T0}.dnb1"]
            # Restarted in the same second: the orphan is under the grace (another broker's upload
            # about to be described would look the same), so it is kept and its id not reused.
            restarted = self.uploader(backend, topic, wal, clock)
            redone = restarted.run_cycle()
            data = wal_bytes(wal)
            assert (redone.start_offset, redone.end_offset) == (5, 9)
            assert redone.object_id != f"data-5-{T0}.dnb1"
            assert sorted(backend.store.list_objects(topic)) == sorted(
                [f"data-0-{T0}.dnb1", f"data-5-{T0}.dnb1", redone.object_id])
            spans = [(d.start_offset, d.end_offset) for d in self.descriptors(backend, topic)]
            assert spans == [(0, 4), (5, 9)]
            assert b"".join(self.object_bytes(backend, topic, d.object_id)
                            for d in self.descriptors(backend, topic)) == data
            # Left behind by a crash too, and restarted past the grace: deleted.
            self.crash_before_the_descriptor_put(backend, topic, wal, clock, range(10, 12))
            clock.now += ORPHAN_GRACE_S
            self.uploader(backend, topic, wal, clock).run_cycle()
        assert f"data-10-{T0}.dnb1" not in backend.store.list_objects(topic)
        assert [(d.start_offset, d.end_offset) for d in self.descriptors(backend, topic)] == [(0, 4), (5, 9), (10, 11)]

    def test_objects_no_descriptor_names_are_left_alone_by_a_broker_that_no_longer_owns_the_topic(
            self, backend, topic):
        """The other half of the soak's defect 5: the deletion belongs to the topic's owner only."""
        clock = FakeClock()
        with self.open_wal(backend, topic) as wal:
            append_messages(wal, topic.broker_name, range(3))
            wal.flush()
            self.uploader(backend, topic, wal, clock).run_cycle()
            self.crash_before_the_descriptor_put(backend, topic, wal, clock, range(3, 5))
            clock.now += ORPHAN_GRACE_S
            owner = {"owns": False}
            self.uploader(backend, topic, wal, clock, owns=lambda: owner["owns"])._reconcile()
            assert backend.store.list_objects(topic) == [f"data-0-{T0}.dnb1", f"data-3-{T0}.dnb1"]
            owner["owns"] = True
            self.uploader(backend, topic, wal, clock, owns=lambda: owner["owns"])._reconcile()
            assert backend.store.list_objects(topic) == [f"data-0-{T0}.dnb1"]

    def test_objects_another_broker_describes_while_the_bucket_is_listed_are_kept(self, backend, topic):
        """Found by the soak: a restarted broker's uploader, recovering a topic the leader had just
        given another broker, read the last descriptor, then listed the bucket (slowly) while the
        other owner uploaded and described the next offsets, and deleted those objects as
        undescribed. The other owner is stood in for by a second uploader of the same WAL, run
        when the bucket is listed."""
        clock = FakeClock()
        with self.open_wal(backend, topic) as wal:
            append_messages(wal, topic.broker_name, range(5))
            wal.flush()
            self.uploader(backend, topic, wal, clock).run_cycle()
            append_messages(wal, topic.broker_name, range(5, 8))
            wal.flush()
            other = self.uploader(backend, topic, wal, FakeClock(T0 + 10))
            listed = backend.store.list_objects

            def list_while_the_other_uploads(name):
                if other is not None and not self.descriptors_past(backend, topic, 4):
                    other.run_cycle()
                return listed(name)

            store = _ListingHook(backend.store, list_while_the_other_uploads)
            restarted = Uploader(topic, wal, store, backend.metadata, backend.keys, clock=clock, durable=False)
            with pytest.raises(MetadataError, match="refusing to overwrite"):  # the offsets are the other's now
                restarted.run_cycle()
        described = {d.object_id for d in self.descriptors(backend, topic)}
        assert f"data-5-{T0 + 10}.dnb1" in described
        assert described <= set(backend.store.list_objects(topic)), "a described object was deleted"

    def descriptors_past(self, backend: Backend, topic: TopicName, offset: int) -> list[ObjectDescriptor]:
        return [d for d in self.descriptors(backend, topic) if d.start_offset > offset]

    def test_failed_commit_in_a_running_uploader_is_redone_under_a_new_id(self, backend, topic):
        clock = FakeClock()
        failing = FailingOnce(backend.metadata, "put_if_absent")
        with self.open_wal(backend, topic) as wal:
            append_messages(wal, topic.broker_name, range(3))
            wal.flush()
            uploader = self.uploader(backend, topic, wal, clock, metadata=failing)
            with pytest.raises(MetadataError, match="injected"):
                uploader.run_cycle()
            redone = uploader.run_cycle()
        assert (redone.start_offset, redone.end_offset) == (0, 2)
        assert backend.store.list_objects(topic) == [redone.object_id]
        assert redone.object_id == f"data-0-{T0 + 1}.dnb1"

    def test_crash_after_the_descriptor_put_resumes_after_it(self, backend, topic, monkeypatch):
        clock = FakeClock()
        real_write = uploader_module.write_checkpoint

        def crash(path, data, fsync):
            raise CheckpointError(f"injected crash before writing {path}")

        with self.open_wal(backend, topic) as wal:
            append_messages(wal, topic.broker_name, range(4))
            wal.flush()
            self.uploader(backend, topic, wal, clock).run_cycle()
            append_messages(wal, topic.broker_name, range(4, 8))
            wal.flush()
            monkeypatch.setattr(uploader_module, "write_checkpoint", crash)
            with pytest.raises(CheckpointError):
                self.uploader(backend, topic, wal, clock).run_cycle()
            monkeypatch.setattr(uploader_module, "write_checkpoint", real_write)
            append_messages(wal, topic.broker_name, range(8, 10))
            wal.flush()
            clock.now += 5
            restarted = self.uploader(backend, topic, wal, clock)
            third = restarted.run_cycle()
        assert (third.start_offset, third.end_offset) == (8, 9)
        spans = [(d.start_offset, d.end_offset) for d in self.descriptors(backend, topic)]
        assert spans == [(0, 3), (4, 7), (8, 9)]
        cur = backend.metadata.get(backend.keys.cur_key(topic))
        assert cur == b'{"start":"00000000000000000008"}'

    def test_offsets_restarting_at_0_never_overwrite_a_descriptor(self, backend, topic):
        """Regression for §6.6: the broker's unsealed restart overwrites `objects/<start>`."""
        with self.open_wal(backend, topic) as wal:
            uploader = self.uploader(backend, topic, wal)
            assert uploader.run_cycle() is None  # reconciled with an empty etcd
            foreign = ObjectDescriptor("data-0-1.dnb1", 0, 99, 1, None, 1, True, [(0, 0)])
            key = backend.keys.object_key(topic, 0)
            backend.metadata.put(key, foreign.to_json())  # another owner's history appears
            append_messages(wal, topic.broker_name, range(3))
            wal.flush()
            with pytest.raises(MetadataError, match="refusing to overwrite"):
                uploader.run_cycle()
        assert backend.metadata.get(key) == foreign.to_json()
        assert backend.store.list_objects(topic) == []

    def test_max_object_bytes_is_checked_frame_by_frame(self, backend, topic):
        with self.open_wal(backend, topic) as wal:
            append_messages(wal, topic.broker_name, range(10))
            wal.flush()
            cap = sum(frame_sizes(wal_bytes(wal))[:3])
            self.uploader(backend, topic, wal, max_object_bytes=cap).drain()
            data = wal_bytes(wal)
        found = self.descriptors(backend, topic)
        assert [(d.start_offset, d.end_offset) for d in found] == [(0, 2), (3, 5), (6, 8), (9, 9)]
        assert all(d.size <= cap for d in found)
        assert b"".join(self.object_bytes(backend, topic, d.object_id) for d in found) == data

    def test_one_object_spans_rotated_segments(self, backend, topic):
        frame = FRAME_HEADER_SIZE + 60
        with self.open_wal(backend, topic, rotate_max_bytes=frame * 3) as wal:
            append_messages(wal, topic.broker_name, range(10))
            wal.flush()
            assert len(wal.segments()) > 2
            descriptor = self.uploader(backend, topic, wal).run_cycle()
            data = wal_bytes(wal)
        assert (descriptor.start_offset, descriptor.end_offset) == (0, 9)
        assert self.object_bytes(backend, topic, descriptor.object_id) == data

    def test_drain_uploads_appends_that_were_not_flushed_yet(self, backend, topic):
        with self.open_wal(backend, topic) as wal:
            append_messages(wal, topic.broker_name, range(7))
            uploader = self.uploader(backend, topic, wal)
            uploader.drain()
            assert uploader.last_committed_offset == 6

    def test_a_corrupt_frame_never_leaves_the_disk(self, backend, topic):
        with self.open_wal(backend, topic) as wal:
            append_messages(wal, topic.broker_name, range(5))
            wal.flush()
            path = wal.segments()[-1].path
            frames = scan_frames(wal_bytes(wal)).frames
            with open(path, "r+b") as fh:  # flip a payload byte of frame 3
                fh.seek(frames[3].payload_pos + 2)
                byte = fh.read(1)
                fh.seek(frames[3].payload_pos + 2)
                fh.write(bytes([byte[0] ^ 0xFF]))
            uploader = self.uploader(backend, topic, wal)
            with pytest.raises(CorruptFrameError) as info:
                uploader.drain()
        assert info.value.offset == 3 and info.value.byte_pos == frames[3].frame_pos
        assert [(d.start_offset, d.end_offset) for d in self.descriptors(backend, topic)] == [(0, 2)]


class TestMemoryBackends(UploaderContract):
    @pytest.fixture
    def backend(self, tmp_path) -> Backend:
        metadata = MemoryMetadataStore()
        yield Backend(ObjectStore(f"memory://bkt-{uuid.uuid4().hex}"), metadata, StorageKeys(), str(tmp_path))
        metadata.close()


def test_index_has_one_entry_per_thousand_frames_from_the_object_start(tmp_path):
    """§4.5 example: 2500 frames → entries for frames 1, 1001 and 2001 of the object."""
    metadata = MemoryMetadataStore()
    topic = TopicName("default", "indexed")
    with Wal.open(topic, WalConfig(root=str(tmp_path), fsync_interval_ms=NEVER_MS, durable=False)) as wal:
        append_messages(wal, topic.broker_name, range(1200))
        wal.flush()
        store = ObjectStore(f"memory://bkt-{uuid.uuid4().hex}")
        uploader = Uploader(topic, wal, store, metadata, StorageKeys(), clock=FakeClock(), durable=False)
        first = uploader.run_cycle()
        first_sizes = frame_sizes(wal_bytes(wal))
        for i in range(1200, 3300):
            wal.append(make_msg(i, topic.broker_name, size=i % 7))
        wal.flush()
        second = uploader.run_cycle()
        sizes = frame_sizes(wal_bytes(wal))[1200:]
    assert INDEX_EVERY_FRAMES == 1000
    assert first.offset_index == [(0, 0), (1000, sum(first_sizes[:1000]))]
    assert second.offset_index == [(1200, 0), (2200, sum(sizes[:1000])), (3200, sum(sizes[:2000]))]
    metadata.close()


def test_background_thread_uploads_at_once_and_stops(tmp_path):
    metadata = MemoryMetadataStore()
    topic = TopicName("default", "background")
    with Wal.open(topic, WalConfig(root=str(tmp_path), fsync_interval_ms=NEVER_MS, durable=False)) as wal:
        wal.append(make_msg(0, topic.broker_name))
        wal.flush()
        store = ObjectStore(f"memory://bkt-{uuid.uuid4().hex}")
        uploader = Uploader(topic, wal, store, metadata, StorageKeys(), interval_s=3600, durable=False)
        uploader.start()
        eventually(lambda: uploader.last_committed_offset == 0, 10)
        uploader.stop()
    assert metadata.get(StorageKeys().cur_key(topic)) == b'{"start":"00000000000000000000"}'
    metadata.close()
