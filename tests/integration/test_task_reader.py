"""Executor-side reading of planned tasks: objects on moto S3 and local files, WAL files.

Chunks are kept small so frames cross chunk boundaries; corruption, missing objects and
missing offsets go through the data-loss policy.
"""

from __future__ import annotations

import os
import secrets
from typing import Iterator

import pytest

from connectors.catalog import TopicCatalog
from connectors.planner import plan_tasks
from connectors.read_task import ReadTask
from connectors.task_reader import read_task
from danube_core import keys
from danube_core.errors import CorruptFrameError, DataLossError
from danube_core.frames import encode_frame
from danube_core.message import encode_message
from danube_core.objectstore import ObjectStore
from danube_core.records import ObjectDescriptor
from tests.topic_builder import PAYLOAD_OFFSET_IN_FRAME, TopicBuilder, messages_of


@pytest.fixture
def builder(metadata, s3_store, tmp_path, unique_name) -> Iterator[TopicBuilder]:
    b = TopicBuilder(metadata, s3_store, str(tmp_path / "wal"), f"/default/{unique_name('reader')}",
                     broker_id=secrets.randbits(64))
    yield b
    b.close()


def tasks_for(builder: TopicBuilder, start: int, end: int, max_partition_bytes: int = 1 << 30,
              fail: bool = True) -> list[ReadTask]:
    catalog = TopicCatalog(builder.metadata, root_prefix=keys.DEFAULT_ROOT_PREFIX,
                           storage_url=builder.store.url, storage_options=builder.store.storage_options,
                           wal_root="auto", fail_on_data_loss=fail)
    snap = catalog.snapshot(builder.name, start)
    plan = plan_tasks({builder.name: snap}, {builder.name: start}, {builder.name: end},
                      max_partition_bytes=max_partition_bytes, fail_on_data_loss=fail)
    assert plan.lost == []
    return plan.tasks


def read_all(tasks, **kwargs):
    return [batch for task in tasks for batch in read_task(task, **kwargs)]


def test_objects_and_wal_read_back_exactly_across_chunk_boundaries(builder):
    builder.append(1200, payload=lambda o: bytes([o % 251]) * (o % 300))
    builder.rotate()
    builder.append(900)
    builder.upload()  # one object spanning wal.log and wal.1.log
    builder.append(40)  # WAL only
    tasks = tasks_for(builder, 0, 2140, max_partition_bytes=64 * 1024)
    assert {t.source for t in tasks} == {builder.descriptors[0].object_id, "wal"}
    assert len(tasks) > 3  # the object is split at its index entries
    got = messages_of(read_all(tasks, chunk_bytes=777))
    assert got == [builder.messages[o] for o in range(2140)]


def test_a_range_inside_an_object_and_selected_columns(builder):
    builder.append(2500)
    builder.upload()
    tasks = tasks_for(builder, 1234, 2001)
    batches = read_all(tasks, columns=["offset", "producer_id", "source"], chunk_bytes=4096)
    rows = [r for b in batches for r in b.to_pylist()]
    assert [r["offset"] for r in rows] == list(range(1234, 2001))
    assert {r["producer_id"] for r in rows} == {builder.messages[0].msg_id.producer_id}  # > 2^63, exact
    assert {r["source"] for r in rows} == {builder.descriptors[0].object_id}
    assert batches[0].schema.names == ["offset", "producer_id", "source"]


def test_reads_are_bounded_by_the_chunk_size_not_the_object(metadata, tmp_path, unique_name, monkeypatch):
    store = ObjectStore(f"file://{tmp_path}/cloud")
    b = TopicBuilder(metadata, store, str(tmp_path / "wal"), f"/default/{unique_name('big')}",
                     broker_id=secrets.randbits(64))
    reads: list[int] = []
    original = ObjectStore.read_range

    def recording(self, path_or_url: str, start: int, end: int) -> bytes:
        data = original(self, path_or_url, start, end)
        reads.append(len(data))
        return data

    try:
        b.append(4000, payload=lambda o: os.urandom(1000))
        b.upload()
        tasks = tasks_for(b, 0, 4000)
        monkeypatch.setattr(ObjectStore, "read_range", recording)
        count = sum(batch.num_rows for batch in read_all(tasks, chunk_bytes=64 * 1024))
    finally:
        b.close()
    assert count == 4000 and len(tasks) == 1
    assert max(reads) <= 64 * 1024
    # Every byte is read once, but for the part of a frame cut by a chunk's end, which is read
    # again with the next chunk (frames here are all about size / 4000 bytes).
    size, frame_bytes = b.descriptors[0].size, b.descriptors[0].size // 4000 + 16
    assert size <= sum(reads) < size + len(reads) * frame_bytes


def test_a_torn_wal_tail_is_not_an_error(builder):
    builder.append(50)
    tasks = tasks_for(builder, 0, 50)
    path, _ = builder.frame_position(0)
    with open(path, "ab") as fh:
        fh.write(encode_frame(50, encode_message(builder.messages[0]))[:30])  # half-written frame
    assert [t.strict for t in tasks] == [False]
    assert messages_of(read_all(tasks)) == [builder.messages[o] for o in range(50)]


def corrupt_object(builder: TopicBuilder, offset: int) -> None:
    """Flip a payload byte of one frame inside the builder's (local) object."""
    descriptor = builder.descriptors[0]
    url = builder.object_url(descriptor)
    data = bytearray(builder.store.read_range(url, 0, descriptor.size))
    pos = sum(len(encode_frame(o, encode_message(builder.messages[o])))
              for o in range(descriptor.start_offset, offset))
    data[pos + PAYLOAD_OFFSET_IN_FRAME] ^= 0xFF
    builder.store.fs.pipe_file(builder.store.fs._strip_protocol(url), bytes(data))


def test_crc_error_in_an_object_fails_naming_object_offset_and_byte(builder):
    builder.append(30)
    builder.upload()
    tasks = tasks_for(builder, 0, 30)
    corrupt_object(builder, 17)
    with pytest.raises(DataLossError) as err:
        read_all(tasks)
    cause = err.value.__cause__
    assert isinstance(cause, CorruptFrameError) and cause.offset == 17
    assert builder.descriptors[0].object_id in str(err.value) and "[17, 30)" in str(err.value)
    assert f"byte {cause.byte_pos}" in str(err.value)


def test_crc_error_without_fail_keeps_the_good_rows_and_counts_the_rest(builder):
    builder.append(30)
    builder.upload()
    tasks = tasks_for(builder, 0, 30, fail=False)
    corrupt_object(builder, 17)
    lost = []
    rows = messages_of(read_all(tasks, on_loss=lost.append))
    assert [m.msg_id.topic_offset for m in rows] == list(range(17))
    assert [(r.start_offset, r.end_offset) for r in lost] == [(17, 30)]


def test_a_missing_object_is_data_loss(builder):
    builder.append(10)
    builder.upload()
    tasks = tasks_for(builder, 0, 10)
    builder.store.delete(builder.object_url(builder.descriptors[0]))
    with pytest.raises(DataLossError, match="does not exist"):
        read_all(tasks)
    lost = []
    relaxed = [ReadTask(**{**t.to_dict(), "fail_on_data_loss": False}) for t in tasks]
    assert read_all(relaxed, on_loss=lost.append) == [] and lost[0].count == 10


def test_missing_offsets_inside_an_object_are_data_loss(metadata, tmp_path, unique_name):
    store = ObjectStore(f"file://{tmp_path}/cloud")
    b = TopicBuilder(metadata, store, str(tmp_path / "wal"), f"/default/{unique_name('holes')}",
                     broker_id=secrets.randbits(64))
    try:
        b.append(20)
        frames = b"".join(encode_frame(o, encode_message(b.messages[o])) for o in range(20) if o not in (10, 11))
        with store.open_writer(b.topic, "data-0-1700000000.dnb1") as writer:
            writer.write(frames)
        descriptor = ObjectDescriptor("data-0-1700000000.dnb1", 0, 19, len(frames), None, 1700000000, True, [(0, 0)])
        metadata.put(b.storage_keys.object_key(b.topic, 0), descriptor.to_json())
        task = ReadTask(b.name, descriptor.object_id, store.object_url(b.topic, descriptor.object_id), {},
                        0, None, 0, 20, True, False)
        lost = []
        rows = messages_of(read_task(task, on_loss=lost.append, chunk_bytes=100))
        with pytest.raises(DataLossError, match=r"\[10, 12\)"):
            list(read_task(ReadTask(**{**task.to_dict(), "fail_on_data_loss": True})))
    finally:
        b.close()
    assert [m.msg_id.topic_offset for m in rows] == [o for o in range(20) if o not in (10, 11)]
    assert [(r.start_offset, r.end_offset) for r in lost] == [(10, 12)]


def test_a_wal_file_shorter_than_planned_is_data_loss(builder):
    builder.append(20)
    tasks = tasks_for(builder, 0, 20)
    path, pos = builder.frame_position(15)
    os.truncate(path, pos)
    with pytest.raises(DataLossError, match=r"\[15, 20\)"):
        read_all(tasks)


@pytest.mark.parametrize("fail", [True, False])
def test_wal_directory_missing_on_the_executor_is_a_setting_not_data_loss(tmp_path, fail):
    from danube_core.errors import WalUnreachableError

    def wal_task(url: str) -> ReadTask:
        return ReadTask(topic="/default/t", source="wal", url=url, storage_options={}, byte_start=0,
                        byte_end=None, start_offset=0, end_offset=5, strict=False, fail_on_data_loss=fail)

    with pytest.raises(WalUnreachableError, match=r"does not exist on host .*walRoot"):
        list(read_task(wal_task((tmp_path / "not-mounted" / "default" / "t" / "wal.log").as_uri())))
    (tmp_path / "mounted").mkdir()
    lost = []
    missing_file = wal_task((tmp_path / "mounted" / "wal.3.log").as_uri())
    if fail:
        with pytest.raises(DataLossError, match=r"\[0, 5\).*does not exist"):
            list(read_task(missing_file))
    else:
        assert list(read_task(missing_file, on_loss=lost.append)) == [] and lost[0].count == 5


def test_reading_a_task_in_a_fresh_worker_imports_no_pandas_and_freezes_the_heap(metadata, tmp_path, unique_name):
    """pyarrow imports pandas to convert Python values (`to_numpy`, `pa.scalar`, `pa.repeat`):
    ~0.4 s of CPU in every fresh Python worker and in each stream's driver process, which reads
    publish times for the lag. Spark's workers do not import it; reading must not either.
    After the read the worker's objects are frozen, so the `gc.collect()` PySpark runs after
    every task walks only what later tasks create (`connectors.worker_heap`)."""
    import json
    import subprocess
    import sys

    store = ObjectStore(f"file://{tmp_path}/cloud")
    b = TopicBuilder(metadata, store, str(tmp_path / "wal"), f"/default/{unique_name('nopandas')}-part-1",
                     broker_id=secrets.randbits(64))
    try:
        b.append(300)
        b.upload()
        b.append(20)  # and a WAL tail
        tasks = tasks_for(b, 0, 320)
    finally:
        b.close()
    script = (
        "import gc, json, sys\n"
        "from connectors.partitions import DanubePartition, read_partition\n"
        "from connectors.read_task import ReadTask\n"
        "tasks = [ReadTask.from_dict(t) for t in json.loads(sys.argv[1])]\n"
        "rows = sum(b.num_rows for b in read_partition(DanubePartition(0, tasks), True))\n"
        "print(json.dumps({'rows': rows, 'pandas': 'pandas' in sys.modules,\n"
        "                  'frozen': gc.get_freeze_count() > 10000, 'walked': len(gc.get_objects()) < 1000}))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", script, json.dumps([t.to_dict() for t in tasks])],
                         capture_output=True, text=True, check=True, env=env)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"rows": 320, "pandas": False, "frozen": True,
                                                               "walked": True}
