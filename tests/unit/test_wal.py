"""The WAL writer: offsets, rotation, wal.ckpt, recovery, reading and waiting."""

from __future__ import annotations

import os
import threading

import pytest

from broker.wal import Wal, WalConfig
from danube_core.wal_files import list_segments
from danube_core.checkpoints import WalCheckpoint, read_checkpoint
from danube_core.errors import ConfigError, DanubeError
from danube_core.frames import FRAME_HEADER_SIZE, scan_frames
from danube_core.message import MessageID, StreamMessage, decode_message, encode_message
from danube_core.topics import TopicName
from tests.rig import eventually

NEVER_MS = 3_600_000  # no background flush during a test unless it asks for one


def make_msg(i: int, topic: str = "/default/orders") -> StreamMessage:
    return StreamMessage(
        request_id=i,
        msg_id=MessageID(producer_id=7, topic_name=topic, broker_addr="http://127.0.0.1:6650/", topic_offset=0),
        payload=f"message-{i}".encode(),
        publish_time=1_700_000_000_000 + i,
        producer_name="p1",
        attributes={"k": str(i)},
    )


def open_wal(root, name: str = "/default/orders", **overrides) -> Wal:
    settings = {"fsync_interval_ms": NEVER_MS, "durable": False, **overrides}
    return Wal.open(TopicName.parse(name), WalConfig(root=str(root), **settings))


def file_offsets(path: str) -> list[int]:
    with open(path, "rb") as fh:
        return [f.offset for f in scan_frames(fh.read()).frames]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_size_rotation_keeps_offsets_in_order_and_each_file_its_own(tmp_path):
    frame_bytes = FRAME_HEADER_SIZE + len(encode_message(make_msg(0)))
    with open_wal(tmp_path, rotate_max_bytes=frame_bytes * 4) as wal:
        offsets = [wal.append(make_msg(i)) for i in range(10)]
        assert wal.segments()[-1].first_offset is None  # offsets 8, 9 are not in the file yet
        wal.flush()
        segments = wal.segments()
    assert offsets == list(range(10))
    names = [os.path.basename(s.path) for s in segments]
    assert names == ["wal.log", "wal.1.log", "wal.2.log"]
    assert [file_offsets(s.path) for s in segments] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [s.first_offset for s in segments] == [0, 4, 8]


def test_time_rotation_happens_only_on_a_write(tmp_path):
    clock = FakeClock()
    config = WalConfig(root=str(tmp_path), fsync_interval_ms=NEVER_MS, durable=False, rotate_max_seconds=60)
    with Wal.open(TopicName.parse("/default/timed"), config, clock=clock) as wal:
        wal.append(make_msg(0))
        wal.append(make_msg(1))
        clock.now += 59
        wal.append(make_msg(2))
        clock.now += 1
        assert len(wal.segments()) == 1  # time alone rotates nothing
        wal.append(make_msg(3))
        clock.now += 120
        wal.append(make_msg(4))
        segments = wal.segments()
    assert [file_offsets(s.path) for s in segments] == [[0, 1, 2], [3], [4]]


def test_checkpoint_after_flush_has_the_spec_fields(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open_wal("./wal", rotate_max_bytes=1) as wal:
        for i in range(3):
            wal.append(make_msg(i))
        assert wal.flush() == 2
        ckpt = read_checkpoint("./wal/default/orders/wal.ckpt", WalCheckpoint)
        assert ckpt == wal.checkpoint
    assert ckpt == WalCheckpoint(
        start_offset=0,
        last_offset=2,
        file_seq=2,
        file_path="./wal/default/orders/wal.2.log",
        rotated_files=[(0, "./wal/default/orders/wal.log", 0), (1, "./wal/default/orders/wal.1.log", 1)],
        active_file_name="wal.2.log",
        last_rotation_at=None,
        active_file_first_offset=2,
    )
    assert not os.path.exists("./wal/default/orders/wal.tmp")


def test_no_checkpoint_before_the_first_flush(tmp_path):
    with open_wal(tmp_path) as wal:
        wal.append(make_msg(0))
        assert wal.checkpoint is None
        assert not os.path.exists(os.path.join(wal.directory, "wal.ckpt"))


def test_payload_offset_is_stamped_and_callers_message_untouched(tmp_path):
    msg = make_msg(0)
    with open_wal(tmp_path) as wal:
        wal.append(make_msg(9))
        assert wal.append(msg) == 1
        wal.flush()
        path = wal.segments()[-1].path
    with open(path, "rb") as fh:
        data = fh.read()
    frames = scan_frames(data).frames
    assert [decode_message(data[f.payload_pos : f.end_pos]).msg_id.topic_offset for f in frames] == [0, 1]
    assert msg.msg_id.topic_offset == 0


def test_max_batch_bytes_flushes_without_an_explicit_flush(tmp_path):
    with open_wal(tmp_path, max_batch_bytes=1) as wal:
        wal.append(make_msg(0))
        assert wal.last_flushed_offset == 0
        assert file_offsets(wal.segments()[-1].path) == [0]


def test_background_flusher_writes_within_the_interval(tmp_path):
    with open_wal(tmp_path, fsync_interval_ms=10) as wal:
        wal.append(make_msg(0))
        eventually(lambda: wal.last_flushed_offset == 0, deadline_s=10)
        assert wal.checkpoint.last_offset == 0


def test_torn_trailing_frame_is_cut_and_appends_continue_after_last_good(tmp_path):
    with open_wal(tmp_path) as wal:
        for i in range(5):
            wal.append(make_msg(i))
        path = wal.segments()[-1].path
    good_size = os.path.getsize(path)
    with open(path, "ab") as fh:  # a frame header claiming 50 bytes, only 3 of them written
        fh.write((5).to_bytes(8, "little") + (50).to_bytes(4, "little") + bytes(4) + b"abc")
    with open_wal(tmp_path) as wal:
        assert os.path.getsize(path) == good_size
        assert wal.next_offset == 5
        assert wal.append(make_msg(5)) == 5
        assert [m.msg_id.topic_offset for m in wal.read(0)] == [0, 1, 2, 3, 4, 5]


def test_flipped_byte_in_last_frame_is_cut(tmp_path, caplog):
    with open_wal(tmp_path) as wal:
        for i in range(4):
            wal.append(make_msg(i))
        path = wal.segments()[-1].path
    with open(path, "rb") as fh:
        data = bytearray(fh.read())
    last_frame_pos = scan_frames(bytes(data)).frames[-1].frame_pos
    data[-2] ^= 0xFF
    with open(path, "wb") as fh:
        fh.write(data)
    with caplog.at_level("WARNING", logger="broker.wal"):
        wal = open_wal(tmp_path)
    with wal:
        assert os.path.getsize(path) == last_frame_pos
        assert f"at byte {last_frame_pos}" in caplog.text and path in caplog.text
        assert wal.append(make_msg(3)) == 3
        assert [m.msg_id.topic_offset for m in wal.read(0)] == [0, 1, 2, 3]


def test_restart_writes_a_new_segment_and_lists_all_in_checkpoint(tmp_path):
    with open_wal(tmp_path, rotate_max_bytes=1) as wal:
        for i in range(2):
            wal.append(make_msg(i))
    with open_wal(tmp_path) as wal:
        assert wal.checkpoint.rotated_files == [
            (0, os.path.join(wal.directory, "wal.log"), 0),
            (1, os.path.join(wal.directory, "wal.1.log"), 1),
        ]
        assert wal.append(make_msg(2)) == 2
        wal.flush()
        assert wal.checkpoint.file_path == os.path.join(wal.directory, "wal.2.log")
        assert [m.msg_id.topic_offset for m in wal.read(0)] == [0, 1, 2]
    # An empty newest segment is reused rather than piling up empty files.
    with open_wal(tmp_path) as wal:
        pass
    with open_wal(tmp_path) as wal:
        assert [os.path.basename(s.path) for s in list_segments(wal.directory)] == [
            "wal.log", "wal.1.log", "wal.2.log", "wal.3.log",
        ]


def test_initial_offset_larger_than_files_is_used(tmp_path):
    with open_wal(tmp_path) as wal:
        wal.append(make_msg(0))
    config = WalConfig(root=str(tmp_path), fsync_interval_ms=NEVER_MS, durable=False)
    with Wal.open(TopicName.parse("/default/orders"), config, initial_offset=22) as wal:
        assert wal.append(make_msg(1)) == 22
        assert [m.msg_id.topic_offset for m in wal.read(0)] == [0, 22]


def test_initial_offset_below_files_never_reuses_an_offset(tmp_path, caplog):
    with open_wal(tmp_path) as wal:
        for i in range(5):
            wal.append(make_msg(i))
    config = WalConfig(root=str(tmp_path), fsync_interval_ms=NEVER_MS, durable=False)
    with caplog.at_level("WARNING", logger="broker.wal"):
        wal = Wal.open(TopicName.parse("/default/orders"), config, initial_offset=2)
    with wal:
        assert wal.append(make_msg(5)) == 5
    assert "initial offset 2 is below the next offset 5" in caplog.text


def test_read_spans_files_and_the_unflushed_tail(tmp_path):
    with open_wal(tmp_path, rotate_max_bytes=200, cache_capacity=0) as wal:
        for i in range(30):
            wal.append(make_msg(i))
        wal.flush()
        for i in range(30, 35):
            wal.append(make_msg(i))
        assert len(wal.segments()) > 3
        assert wal.last_flushed_offset < 34  # rotations flushed some of the tail, not all
        got = list(wal.read(3))
        assert [m.msg_id.topic_offset for m in got] == list(range(3, 35))
        assert [m.request_id for m in got] == list(range(3, 35))
        assert [m.msg_id.topic_offset for m in wal.read(34)] == [34]
        assert list(wal.read(35)) == []


def test_read_with_appends_racing_yields_each_offset_once(tmp_path):
    with open_wal(tmp_path, rotate_max_bytes=500, cache_capacity=3, max_batch_bytes=300) as wal:
        for i in range(20):
            wal.append(make_msg(i))
        reader = wal.read(0)
        first = [next(reader).msg_id.topic_offset for _ in range(5)]
        for i in range(20, 60):  # flushes and cache trimming happen while the reader is paused
            wal.append(make_msg(i))
        rest = [m.msg_id.topic_offset for m in reader]
    assert first + rest == list(range(20))


def test_wait_for_returns_when_offset_appended(tmp_path):
    with open_wal(tmp_path) as wal:
        assert wal.wait_for(0, timeout_s=0.01) is False
        result: list[bool] = []
        waiter = threading.Thread(target=lambda: result.append(wal.wait_for(2, timeout_s=30)))
        waiter.start()
        for i in range(3):
            wal.append(make_msg(i))
        waiter.join(30)
        assert result == [True]
        assert wal.wait_for(1, timeout_s=0) is True


def test_concurrent_appends_get_unique_contiguous_offsets(tmp_path):
    with open_wal(tmp_path, rotate_max_bytes=4000, max_batch_bytes=2000) as wal:
        got: list[list[int]] = [[] for _ in range(4)]

        def produce(k: int) -> None:
            got[k].extend(wal.append(make_msg(i)) for i in range(300))

        threads = [threading.Thread(target=produce, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wal.flush()
        assert sorted(o for part in got for o in part) == list(range(1200))
        assert [m.msg_id.topic_offset for m in wal.read(0)] == list(range(1200))
        on_disk = [o for s in wal.segments() for o in file_offsets(s.path)]
    assert on_disk == list(range(1200))


def test_closed_wal_refuses_appends(tmp_path):
    wal = open_wal(tmp_path)
    wal.close()
    wal.close()
    with pytest.raises(DanubeError, match="closed"):
        wal.append(make_msg(0))


def test_active_segment_cannot_be_deleted(tmp_path):
    with open_wal(tmp_path) as wal:
        wal.append(make_msg(0))
        with pytest.raises(ValueError, match="active"):
            wal.delete_segments([wal.segments()[-1].seq])


@pytest.mark.parametrize(
    "option, value",
    [("fsync_interval_ms", 0), ("max_batch_bytes", 0), ("rotate_max_bytes", 0),
     ("rotate_max_seconds", -1), ("file_name", "a/b.log"), ("cache_capacity", -1)],
)
def test_bad_config_names_the_option(tmp_path, option, value):
    with pytest.raises(ConfigError, match=option):
        WalConfig(root=str(tmp_path), **{option: value})


def test_corrupt_older_segment_is_left_alone_and_its_gap_skipped(tmp_path, caplog):
    frame_bytes = FRAME_HEADER_SIZE + len(encode_message(make_msg(0)))
    with open_wal(tmp_path, rotate_max_bytes=frame_bytes * 3, cache_capacity=0) as wal:
        for i in range(9):
            wal.append(make_msg(i))
        middle = wal.segments()[1].path  # offsets 3, 4, 5
    with open(middle, "r+b") as fh:
        fh.seek(frame_bytes + FRAME_HEADER_SIZE + 3)  # inside the payload of offset 4
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))
    size = os.path.getsize(middle)
    with caplog.at_level("WARNING", logger="broker.wal"):
        wal = open_wal(tmp_path, cache_capacity=0)
    with wal:
        assert os.path.getsize(middle) == size  # evidence kept: only the newest file is cut
        assert wal.next_offset == 9
        assert [m.msg_id.topic_offset for m in wal.read(0)] == [0, 1, 2, 3, 6, 7, 8]
    assert "offsets 4..5 are missing" in caplog.text
    assert f"older WAL file {middle} is unreadable after byte {frame_bytes}" in caplog.text
