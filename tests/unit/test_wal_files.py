"""Listing, ordering and scanning a topic's WAL files (spec §3.6, §1.4)."""

from __future__ import annotations

import io
import os

import fsspec
import pytest

from danube_core.wal_files import (
    FrameFileScanner,
    WalSegment,
    list_segments,
    read_segments,
    scan_segment,
    segment_file_name,
    segment_seq,
)
from danube_core.checkpoints import WalCheckpoint
from danube_core.frames import encode_frame
from danube_core.message import MessageID, StreamMessage, encode_message, with_offset


def frame(offset: int, payload_size: int = 5) -> bytes:
    msg = StreamMessage(
        request_id=offset,
        msg_id=MessageID(producer_id=1, topic_name="/ns/t", broker_addr="", topic_offset=offset),
        payload=bytes([offset % 251]) * payload_size,
        publish_time=offset,
        producer_name="p",
    )
    return encode_frame(offset, encode_message(msg))


def write(path, offsets, tail: bytes = b"") -> None:
    with open(path, "wb") as fh:
        fh.write(b"".join(frame(o) for o in offsets) + tail)


def names(segments) -> list[str]:
    return [os.path.basename(s.path) for s in segments]


def test_segment_names_round_trip():
    assert segment_file_name(0) == "wal.log"
    assert segment_file_name(3) == "wal.3.log"
    assert [segment_seq(n) for n in ("wal.log", "wal.3.log", "wal.0.log", "wal.ckpt", "wal.tmp")] == [
        0, 3, None, None, None,
    ]


def test_listing_orders_by_frame_offsets_not_seq(tmp_path):
    # After a real-broker restart wal.log (seq 0) holds newer offsets than wal.3.log.
    write(tmp_path / "wal.log", [200, 201])
    write(tmp_path / "wal.3.log", [100, 101])
    write(tmp_path / "wal.2.log", [0, 1])
    (tmp_path / "wal.5.log").write_bytes(b"")
    (tmp_path / "wal.ckpt").write_bytes(b"\x00")
    segments = list_segments(str(tmp_path))
    assert names(segments) == ["wal.2.log", "wal.3.log", "wal.log", "wal.5.log"]
    assert [s.first_offset for s in segments] == [0, 100, 200, None]
    assert [s.seq for s in segments] == [2, 3, 0, 5]


def test_checkpoint_paths_resolve_against_base_dir_then_by_name(tmp_path):
    broker_cwd = tmp_path / "broker"
    topic_dir = broker_cwd / "danube-data" / "wal" / "default" / "orders"
    topic_dir.mkdir(parents=True)
    write(topic_dir / "wal.log", [0])
    write(topic_dir / "wal.1.log", [1])
    ckpt = WalCheckpoint(
        start_offset=0, last_offset=1, file_seq=1,
        file_path="./danube-data/wal/default/orders/wal.1.log",
        rotated_files=[(0, "./danube-data/wal/default/orders/wal.log", 0),
                       (7, "./gone/wal.7.log", 5)],
        active_file_name="wal.1.log",
    )
    segments = list_segments(str(topic_dir), ckpt, base_dir=str(broker_cwd))
    assert [(s.seq, s.path) for s in segments] == [
        (0, str(broker_cwd / "danube-data/wal/default/orders/wal.log")),
        (1, str(broker_cwd / "danube-data/wal/default/orders/wal.1.log")),
    ]
    # The directory was copied elsewhere: the checkpoint's paths miss, the file names match.
    copied = list_segments(str(topic_dir), ckpt, base_dir=str(tmp_path / "elsewhere"))
    assert [(s.seq, s.path) for s in copied] == [
        (0, str(topic_dir / "wal.log")), (1, str(topic_dir / "wal.1.log")),
    ]


def test_works_through_an_fsspec_filesystem():
    fs = fsspec.filesystem("memory")
    with fs.open("/walroot/ns/t/wal.log", "wb") as fh:
        fh.write(frame(10) + frame(11))
    with fs.open("/walroot/ns/t/wal.1.log", "wb") as fh:
        fh.write(frame(0))
    segments = list_segments("/walroot/ns/t", None, fs)
    assert names(segments) == ["wal.1.log", "wal.log"]
    assert [m.msg_id.topic_offset for m in read_segments(segments, 0, fs=fs)] == [0, 10, 11]


def test_missing_directory_lists_nothing(tmp_path):
    assert list_segments(str(tmp_path / "nope")) == []


@pytest.mark.parametrize("chunk_bytes", [1, 7, 40, 1 << 20])
def test_scanner_crosses_chunk_boundaries_and_reports_a_torn_tail(chunk_bytes):
    data = frame(0) + frame(1, payload_size=300) + frame(2) + frame(3)[:20]
    scanner = FrameFileScanner(io.BytesIO(data), chunk_bytes=chunk_bytes)
    got = [(o, pos, bytes(p)) for o, pos, p in scanner]
    assert [o for o, _, _ in got] == [0, 1, 2]
    assert got[1][1] == len(frame(0))
    assert (scanner.stop_reason, scanner.stop_offset) == ("partial", 3)
    assert scanner.stop_pos == scanner.safe_end == len(data) - 20


def test_scanner_stops_at_a_crc_mismatch():
    bad = bytearray(frame(1))
    bad[-1] ^= 0x01
    data = frame(0) + bytes(bad) + frame(2)
    scanner = FrameFileScanner(io.BytesIO(data), chunk_bytes=16)
    assert [o for o, _, _ in scanner] == [0]
    assert (scanner.stop_reason, scanner.stop_pos, scanner.stop_offset) == ("crc", len(frame(0)), 1)


def test_scan_segment_reports_real_first_and_last(tmp_path):
    write(tmp_path / "wal.log", [4, 5, 6], tail=b"\x01\x02")
    scan = scan_segment(WalSegment(0, str(tmp_path / "wal.log"), 4))
    assert (scan.segment.first_offset, scan.segment.last_offset) == (4, 6)
    assert scan.stop_reason == "partial" and scan.size - scan.safe_end == 2


def test_read_segments_filters_the_range_and_never_goes_back(tmp_path):
    write(tmp_path / "wal.1.log", [0, 1, 2, 3])
    write(tmp_path / "wal.log", [2, 3, 4, 5])  # a restarted broker repeated 2 and 3
    segments = list_segments(str(tmp_path))
    got = [m.msg_id.topic_offset for m in read_segments(segments, 1, 5)]
    assert got == [1, 2, 3, 4]


def test_read_segments_takes_the_offset_from_the_header(tmp_path):
    msg = StreamMessage(request_id=1, msg_id=MessageID(1, "/ns/t", "", 999), payload=b"x",
                        publish_time=1, producer_name="p")
    (tmp_path / "wal.log").write_bytes(encode_frame(5, encode_message(with_offset(msg, 999))))
    [got] = read_segments(list_segments(str(tmp_path)), 0)
    assert got.msg_id.topic_offset == 5
