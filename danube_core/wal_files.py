"""Finding, ordering and scanning one topic's WAL files (spec §3.6).

Shared by the WAL's own recovery and reader, the uploader and the connector's planner, so it
lives in `danube_core` and imports only `danube_core` and fsspec: the connector reads a remote
broker's WAL directory through an fsspec filesystem, the broker through the local one.

The file list combines two sources, because neither is complete on its own:
* `wal.ckpt` (rotated files + the active file). The broker writes paths exactly as configured,
  often relative to *its* working directory, and only lists rotations of its current process.
* a directory listing: `wal.log` is seq 0 and `wal.<n>.log` is seq n.
The result is ordered by the offset in each file's first frame header, not by seq: after a
real-broker restart `wal.log` may hold newer offsets than `wal.3.log` (§3.6, §6.6).
"""

from __future__ import annotations

import logging
import posixpath
import re
import struct
from dataclasses import dataclass
from typing import BinaryIO, Iterator

import fsspec

from danube_core.checkpoints import WalCheckpoint
from danube_core.errors import CorruptFrameError, PayloadDecodeError
from danube_core.frames import (
    FRAME_HEADER,
    FRAME_HEADER_SIZE,
    STOP_CRC,
    STOP_END,
    STOP_PARTIAL,
    scan_frames,
)
from danube_core.message import StreamMessage, decode_message

logger = logging.getLogger(__name__)

DEFAULT_FILE_NAME = "wal.log"
DEFAULT_CHUNK_BYTES = 8 * 1024 * 1024
_ROTATED_NAME = re.compile(r"^wal\.([0-9]+)\.log$")
_OFFSET_FIELD = struct.Struct("<Q")


@dataclass(frozen=True)
class WalSegment:
    """One WAL file. `first_offset` is its first frame's offset (None: no complete header).

    `last_offset` is the largest offset in the file when known: the writer knows it for its
    own files; a directory listing does not read that far and leaves it None.
    """

    seq: int
    path: str
    first_offset: int | None
    last_offset: int | None = None


def segment_file_name(seq: int, file_name: str = DEFAULT_FILE_NAME) -> str:
    """`file_name` for seq 0, else `wal.<seq>.log` (the broker never writes `wal.0.log`)."""
    return file_name if seq == 0 else f"wal.{seq}.log"


def segment_seq(name: str, file_name: str = DEFAULT_FILE_NAME) -> int | None:
    """Inverse of `segment_file_name` for a bare file name; None for other files."""
    if name == file_name:
        return 0
    match = _ROTATED_NAME.match(name)
    if match is None or int(match.group(1)) == 0:
        return None
    return int(match.group(1))


def _filesystem(fs: fsspec.AbstractFileSystem | None) -> fsspec.AbstractFileSystem:
    return fs if fs is not None else fsspec.filesystem("file")


def read_first_offset(path: str, fs: fsspec.AbstractFileSystem | None = None) -> int | None:
    """Offset in the first frame header of `path`; None if it holds less than one header."""
    with _filesystem(fs).open(path, "rb") as fh:
        head = fh.read(FRAME_HEADER_SIZE)
    if len(head) < FRAME_HEADER_SIZE:
        return None
    return FRAME_HEADER.unpack(head)[0]


def list_segments(
    topic_dir: str,
    checkpoint: WalCheckpoint | None = None,
    fs: fsspec.AbstractFileSystem | None = None,
    *,
    base_dir: str | None = None,
    file_name: str = DEFAULT_FILE_NAME,
) -> list[WalSegment]:
    """Every existing WAL file of a topic, ordered by first frame offset (then seq).

    `base_dir` is the directory the broker's relative checkpoint paths are relative to (its
    working directory); a checkpoint path that does not exist there is looked up by file name
    inside `topic_dir`. Missing files are dropped. Files without a complete first header
    (empty or torn) come last, since the writer is about to fill them.
    """
    fs = _filesystem(fs)
    found: dict[str, tuple[int, str]] = {}
    for seq, path in _checkpoint_entries(checkpoint):
        resolved = _resolve(fs, path, topic_dir, base_dir)
        if resolved is not None:
            found.setdefault(_identity(fs, resolved), (seq, resolved))
    for seq, path in _listed_entries(fs, topic_dir, file_name):
        found.setdefault(_identity(fs, path), (seq, path))
    segments = []
    for seq, path in found.values():
        try:
            first = read_first_offset(path, fs)
        except FileNotFoundError:
            continue  # deleted by retention between listing and opening
        segments.append(WalSegment(seq, path, first))
    segments.sort(key=lambda s: (s.first_offset is None, s.first_offset or 0, s.seq))
    return segments


def _checkpoint_entries(checkpoint: WalCheckpoint | None) -> list[tuple[int, str]]:
    if checkpoint is None:
        return []
    entries = [(seq, path) for seq, path, _first in checkpoint.rotated_files]
    entries.append((checkpoint.file_seq, checkpoint.file_path))
    return [(seq, path) for seq, path in entries if path]


def _resolve(
    fs: fsspec.AbstractFileSystem, path: str, topic_dir: str, base_dir: str | None
) -> str | None:
    candidates = []
    if base_dir is not None and not posixpath.isabs(path):
        candidates.append(posixpath.normpath(posixpath.join(base_dir, path)))
    else:
        candidates.append(path)
    candidates.append(posixpath.join(topic_dir, posixpath.basename(path)))
    for candidate in candidates:
        if fs.exists(candidate):
            return candidate
    logger.debug("WAL file %s from wal.ckpt is gone (also not in %s)", path, topic_dir)
    return None


def _listed_entries(
    fs: fsspec.AbstractFileSystem, topic_dir: str, file_name: str
) -> list[tuple[int, str]]:
    try:
        names = fs.ls(topic_dir, detail=False)
    except FileNotFoundError:
        return []
    entries = []
    for name in names:
        base = posixpath.basename(name.rstrip("/"))
        seq = segment_seq(base, file_name)
        if seq is not None:
            entries.append((seq, posixpath.join(topic_dir, base)))
    return entries


def _identity(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """One key per physical file, whether named relatively, absolutely or with a protocol."""
    return posixpath.normpath(fs._strip_protocol(path))


class FrameFileScanner:
    """CRC-checked frames of one WAL file or object, read in bounded chunks.

    Iterating yields `(offset, frame_pos, payload)` with `frame_pos` absolute in the file
    and `payload` a memoryview valid after the next step. It stops at the first partial or
    corrupt frame, as every broker reader does (§1.4); afterwards `stop_reason` is
    "end" | "partial" | "crc", `stop_pos` the byte position of the frame it stopped at,
    `stop_offset` that frame's header offset when at least 8 bytes of it exist, and
    `safe_end` the byte position just past the last good frame.
    """

    def __init__(
        self, fh: BinaryIO, *, start_pos: int = 0, chunk_bytes: int = DEFAULT_CHUNK_BYTES
    ) -> None:
        self._fh = fh
        self._chunk_bytes = chunk_bytes
        self.safe_end = start_pos
        self.stop_reason: str | None = None
        self.stop_pos: int | None = None
        self.stop_offset: int | None = None

    def __iter__(self) -> Iterator[tuple[int, int, memoryview]]:
        buf = b""
        eof = False
        while True:
            if not eof:
                data = self._fh.read(self._read_size(buf))
                eof = not data
                buf = buf + data if buf else data
            scan = scan_frames(buf)
            view = memoryview(buf)
            for ref in scan.frames:
                yield ref.offset, self.safe_end + ref.frame_pos, view[ref.payload_pos : ref.end_pos]
            if scan.stop_reason == STOP_CRC:
                self._stop(STOP_CRC, buf, scan.safe_end)
                return
            buf = buf[scan.safe_end :]
            self.safe_end += scan.safe_end
            if eof:
                self._stop(STOP_PARTIAL if buf else STOP_END, buf, 0)
                return

    def _read_size(self, leftover: bytes) -> int:
        # A frame larger than a chunk is read in one go rather than in quadratic increments.
        if len(leftover) >= FRAME_HEADER_SIZE:
            length = FRAME_HEADER.unpack_from(leftover)[1]
            return max(self._chunk_bytes, FRAME_HEADER_SIZE + length - len(leftover))
        return self._chunk_bytes

    def _stop(self, reason: str, buf: bytes, pos_in_buf: int) -> None:
        self.stop_reason = reason
        if reason == STOP_END:
            return
        if reason == STOP_CRC:
            self.safe_end += pos_in_buf
        self.stop_pos = self.safe_end
        if len(buf) - pos_in_buf >= _OFFSET_FIELD.size:
            self.stop_offset = _OFFSET_FIELD.unpack_from(buf, pos_in_buf)[0]


@dataclass(frozen=True)
class SegmentScan:
    """A whole-file scan: the segment with its real first/last offsets (None if no good
    frame) and where the readable part ends (`safe_end`, of `size` bytes)."""

    segment: WalSegment
    stop_reason: str
    stop_pos: int | None
    stop_offset: int | None
    safe_end: int
    size: int


def scan_segment(seg: WalSegment, fs: fsspec.AbstractFileSystem | None = None) -> SegmentScan:
    """Read every frame header of `seg` (CRC-checked, payloads not decoded)."""
    first = last = None
    with _filesystem(fs).open(seg.path, "rb") as fh:
        scanner = FrameFileScanner(fh)
        for offset, _pos, _payload in scanner:
            first = offset if first is None else first
            last = offset if last is None else max(last, offset)
        size = fh.seek(0, 2)
    return SegmentScan(
        WalSegment(seg.seq, seg.path, first, last), scanner.stop_reason or STOP_END,
        scanner.stop_pos, scanner.stop_offset, scanner.safe_end, size,
    )


def read_segments(
    segments: list[WalSegment],
    from_offset: int,
    stop_offset: int | None = None,
    fs: fsspec.AbstractFileSystem | None = None,
) -> Iterator[StreamMessage]:
    """Messages with `from_offset <= offset < stop_offset` from `segments`, in their order.

    Offsets only go up: a frame at or below one already yielded is skipped (a real broker's
    restarted `wal.log` can repeat offsets, §6.6). `topic_offset` is set from the frame
    header, as the broker's WAL reader does (§2.6). A file stops at its first partial,
    corrupt or undecodable frame (logged) and reading goes on with the next file.
    """
    pos = from_offset
    fs = _filesystem(fs)
    for seg in segments:
        if stop_offset is not None and pos >= stop_offset:
            return
        if seg.first_offset is None or (stop_offset is not None and seg.first_offset >= stop_offset):
            continue
        if seg.last_offset is not None and seg.last_offset < pos:
            continue
        try:
            fh = fs.open(seg.path, "rb")
        except FileNotFoundError:
            continue  # deleted by retention after the caller listed it
        with fh:
            for msg in _read_file(fh, seg.path, pos, stop_offset):
                yield msg
                pos = msg.msg_id.topic_offset + 1


def _read_file(
    fh: BinaryIO, path: str, pos: int, stop_offset: int | None
) -> Iterator[StreamMessage]:
    scanner = FrameFileScanner(fh)
    for offset, frame_pos, payload in scanner:
        if offset < pos:
            continue
        if stop_offset is not None and offset >= stop_offset:
            return
        try:
            msg = decode_message(payload)
        except PayloadDecodeError as exc:
            logger.error("%s", CorruptFrameError(path, offset, frame_pos, str(exc)))
            return
        msg.msg_id.topic_offset = offset
        yield msg
        pos = offset + 1
    if scanner.stop_reason != STOP_END:
        logger.warning(
            "WAL file %s: reading stops at a %s frame (offset %s) at byte %d",
            path, scanner.stop_reason, scanner.stop_offset, scanner.stop_pos,
        )
