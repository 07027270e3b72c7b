"""Local WAL retention never deletes an un-uploaded or active segment (spec §3.7)."""

from __future__ import annotations

import os

import pytest

from broker.retention import WalRetention
from broker.wal import Wal, WalConfig
from danube_core.checkpoints import UploaderCheckpoint, WalCheckpoint, read_checkpoint, write_checkpoint
from danube_core.message import MessageID, StreamMessage
from danube_core.topics import TopicName
from tests.rig import eventually

NOW = 1_800_000_000.0
DAY = 86_400


def make_msg(i: int) -> StreamMessage:
    return StreamMessage(
        request_id=i, msg_id=MessageID(1, "/default/kept", "", 0), payload=b"x" * 40,
        publish_time=i, producer_name="p",
    )


@pytest.fixture
def wal(tmp_path):
    """Four segments: offsets 0-2, 3-5, 6-8 rotated, 9 in the active file."""
    config = WalConfig(root=str(tmp_path), fsync_interval_ms=3_600_000, durable=False, rotate_max_bytes=200,
                       cache_capacity=0)
    with Wal.open(TopicName.parse("/default/kept"), config) as w:
        for i in range(10):
            w.append(make_msg(i))
        w.flush()
        assert [(s.first_offset, s.last_offset) for s in w.segments()] == [(0, 2), (3, 5), (6, 8), (9, 9)]
        for seg in w.segments():
            os.utime(seg.path, (NOW - 10 * DAY, NOW - 10 * DAY))
        yield w


def uploaded_up_to(wal: Wal, offset: int | None) -> str:
    path = os.path.join(wal.directory, "uploader.ckpt")
    object_id = None if offset is None else f"data-0-{int(NOW)}.dnb1"
    ckpt = UploaderCheckpoint(last_committed_offset=offset or 0, last_object_id=object_id)
    write_checkpoint(path, ckpt.encode(), fsync=False)
    return path


def retention(wal: Wal, ckpt_path: str, **rules) -> WalRetention:
    settings = {"max_age_s": None, "max_total_bytes": None, **rules}
    return WalRetention(wal, uploader_checkpoint_path=ckpt_path, clock=lambda: NOW, **settings)


def first_offsets(wal: Wal) -> list[int | None]:
    return [s.first_offset for s in wal.segments()]


def test_nothing_is_deleted_without_an_uploaded_object(wal):
    missing = os.path.join(wal.directory, "uploader.ckpt")
    assert retention(wal, missing, max_age_s=0, max_total_bytes=0).run_once() == []
    zeros = uploaded_up_to(wal, None)  # a checkpoint of zeros is not "offset 0 uploaded"
    assert retention(wal, zeros, max_age_s=0, max_total_bytes=0).run_once() == []
    assert first_offsets(wal) == [0, 3, 6, 9]


def test_partly_uploaded_and_active_segments_are_kept(wal):
    ckpt = uploaded_up_to(wal, 4)  # segment 3-5 is only partly uploaded
    deleted = retention(wal, ckpt, max_age_s=0, max_total_bytes=0).run_once()
    assert [os.path.basename(p) for p in deleted] == ["wal.log"]
    assert first_offsets(wal) == [3, 6, 9]
    everything = uploaded_up_to(wal, 9)  # even fully uploaded, the active file stays
    retention(wal, everything, max_age_s=0, max_total_bytes=0).run_once()
    assert first_offsets(wal) == [9]
    assert os.path.exists(wal.segments()[-1].path)


def test_age_rule_uses_mtime(wal):
    ckpt = uploaded_up_to(wal, 9)
    young = wal.segments()[1].path
    os.utime(young, (NOW - 60, NOW - 60))
    deleted = retention(wal, ckpt, max_age_s=DAY).run_once()
    assert sorted(os.path.basename(p) for p in deleted) == ["wal.2.log", "wal.log"]
    assert first_offsets(wal) == [3, 9]


def test_size_rule_deletes_oldest_until_under_the_limit(wal):
    ckpt = uploaded_up_to(wal, 9)
    sizes = [os.path.getsize(s.path) for s in wal.segments()]
    limit = sum(sizes) - sizes[0]  # dropping the oldest file is enough
    deleted = retention(wal, ckpt, max_total_bytes=limit).run_once()
    assert [os.path.basename(p) for p in deleted] == ["wal.log"]
    assert retention(wal, ckpt, max_total_bytes=limit).run_once() == []


def test_checkpoint_records_deletions_and_the_writer_keeps_them(wal):
    ckpt = uploaded_up_to(wal, 5)
    retention(wal, ckpt, max_age_s=0).run_once()
    on_disk = read_checkpoint(os.path.join(wal.directory, "wal.ckpt"), WalCheckpoint)
    assert on_disk.start_offset == 6
    assert [seq for seq, _path, _first in on_disk.rotated_files] == [2]
    wal.append(make_msg(10))
    wal.flush()
    after = read_checkpoint(os.path.join(wal.directory, "wal.ckpt"), WalCheckpoint)
    assert (after.start_offset, [r[0] for r in after.rotated_files]) == (6, [2])
    assert [m.msg_id.topic_offset for m in wal.read(0)] == [6, 7, 8, 9, 10]


def test_no_rules_delete_nothing(wal):
    assert retention(wal, uploaded_up_to(wal, 9)).run_once() == []


def test_background_thread_runs_cycles(wal):
    keeper = retention(wal, uploaded_up_to(wal, 9), max_age_s=0)
    keeper.start(interval_s=3600)
    try:
        eventually(lambda: first_offsets(wal) == [9], deadline_s=10)
    finally:
        keeper.stop()
