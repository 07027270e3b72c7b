"""The per-topic write-ahead log: offsets, batching, flushing, rotation, recovery (spec §1, §3).

Why one module of ~520 lines: one `Wal` owns the file handles, the lock, the batch and the
offsets (the single-writer rule); recovery, flushing, rotation and reading the unflushed tail
all work on that one state, and the file format itself already lives in `danube_core.wal_files`.

One `Wal` per reliable topic owns the topic's file handles (single writer). `append` gives a
message the next offset, stamps it into `msg_id.topic_offset` (§2.6), encodes it and adds the
frame to an in-memory batch; the batch reaches the file on `flush`, when it grows past
`max_batch_bytes`, or every `fsync_interval_ms` from a background thread. Every non-empty flush
rewrites `wal.ckpt` through `wal.tmp` and a rename (§3.4), except a group-commit flush
(`write_checkpoint=False`), whose checkpoint the next periodic flush or close writes.

Deliberate differences from the v0.7.3 broker, all keeping the on-disk formats:
* `durable=True` fsyncs the file on every flush and the checkpoint + directory on rename; the
  broker never calls fsync(2) (§3.3).
* The batch is flushed before rotating, so every file holds only its own frames and the
  recorded first offsets are exact (the broker's are approximate, §3.2).
* On open, every existing `wal.log` / `wal.N.log` is scanned, a torn or corrupt tail of the
  newest file is cut off (logged with file and byte position), and offsets continue at the
  largest offset found + 1 (never reused). Writing continues in a **new** segment
  `wal.<max seq + 1>.log` (an empty newest segment is reused instead), never behind or inside
  a file written by an earlier process: seq order stays offset order, and byte positions the
  uploader recorded in older files stay valid. The broker goes back to `wal.log` (§3.2).
* `wal.ckpt` lists every live segment in `rotated_files` (the broker only lists rotations of
  its own process) and `start_offset` is the first offset still on disk. Retention deletes
  segments through `delete_segments`, so the writer never overwrites its changes (§3.7).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from itertools import islice
from typing import Callable, Generator, Iterable

from danube_core.checkpoints import WAL_CHECKPOINT_NAME, WalCheckpoint, write_checkpoint
from danube_core.errors import DanubeError
from danube_core.frames import FRAME_HEADER_SIZE, STOP_END, encode_frame
from danube_core.message import StreamMessage, encode_message, with_offset
from danube_core.topics import TopicName
from danube_core.wal_files import (
    DEFAULT_FILE_NAME,
    SegmentScan,
    WalSegment,
    list_segments,
    read_segments,
    scan_segment,
    segment_file_name,
)

from broker.option_scope import OptionScope

logger = logging.getLogger(__name__)

_WAL_OPTION = OptionScope("WAL option")


@dataclass(frozen=True)
class WalConfig:
    """WAL settings; names and defaults follow the broker's `wal` config block (§3.2, §3.3).

    `root` is used exactly as configured: a relative root stays relative (§3.1), and so do
    the paths written into `wal.ckpt`.
    """

    root: str
    file_name: str = DEFAULT_FILE_NAME
    fsync_interval_ms: int = 5000
    max_batch_bytes: int = 10 * 1024 * 1024
    rotate_max_bytes: int | None = None
    rotate_max_seconds: int | None = None
    durable: bool = True
    cache_capacity: int = 1024

    def __post_init__(self) -> None:
        require = _WAL_OPTION.require
        require(bool(self.root), "root", self.root, "a directory path")
        require(
            bool(self.file_name) and "/" not in self.file_name and self.file_name != WAL_CHECKPOINT_NAME,
            "file_name", self.file_name, "a plain file name such as wal.log",
        )
        require(self.fsync_interval_ms > 0, "fsync_interval_ms", self.fsync_interval_ms, "an integer > 0")
        require(self.max_batch_bytes > 0, "max_batch_bytes", self.max_batch_bytes, "an integer > 0")
        for name in ("rotate_max_bytes", "rotate_max_seconds"):
            value = getattr(self, name)
            require(value is None or value > 0, name, value, "None (off) or an integer > 0")
        require(self.cache_capacity >= 0, "cache_capacity", self.cache_capacity, "an integer >= 0")


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _cut_torn_tail(scan: SegmentScan, durable: bool) -> None:
    """Truncate the newest file after its last good frame so appends and readers see whole frames."""
    with open(scan.segment.path, "r+b") as fh:
        fh.truncate(scan.safe_end)
        if durable:
            os.fsync(fh.fileno())
    logger.warning(
        "recovered WAL file %s: %s frame (offset %s) at byte %d, cut off %d bytes",
        scan.segment.path, scan.stop_reason, scan.stop_offset, scan.safe_end,
        scan.size - scan.safe_end,
    )


class Wal:
    """The write-ahead log of one topic; create it with `Wal.open`.

    Thread-safe. Messages returned by `read` are shared with the in-memory cache: do not
    mutate them.
    """

    def __init__(
        self, topic: TopicName, config: WalConfig, directory: str, clock: Callable[[], float]
    ) -> None:
        self.topic = topic
        self.config = config
        self.directory = directory
        self._clock = clock
        self._ckpt_path = os.path.join(directory, WAL_CHECKPOINT_NAME)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._io_lock = threading.Lock()  # taken before _lock; serialises file and ckpt writes
        self._batch = bytearray()
        self._batch_last: int | None = None
        self._recent: deque[tuple[int, StreamMessage]] = deque()  # every unflushed + cache
        self._rotated: list[WalSegment] = []
        self._next_offset = 0
        self._last_flushed: int | None = None
        self._checkpoint: WalCheckpoint | None = None
        self._checkpoint_pending: WalCheckpoint | None = None  # in memory, not yet in wal.ckpt
        self._max_seq = -1
        self._closed = False
        self.fsync_count = 0
        self.flush_count = 0
        self._stop = threading.Event()
        self._flusher = threading.Thread(target=self._flush_loop, name=f"wal-flush-{topic}", daemon=True)

    @classmethod
    def open(
        cls,
        topic: TopicName,
        config: WalConfig,
        *,
        initial_offset: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> "Wal":
        """Recover `<root>/{ns}/{topic}/` and start the background flusher.

        `initial_offset` (a sealed topic's `last_committed_offset + 1`) wins only if it is
        larger than what the files imply; offsets are never reused. `clock` (seconds) drives
        time-based rotation.
        """
        directory = os.path.join(config.root, topic.namespace, topic.topic)
        os.makedirs(directory, exist_ok=True)
        wal = cls(topic, config, directory, clock)
        wal._recover(initial_offset)
        wal._flusher.start()
        return wal

    def _recover(self, initial_offset: int | None) -> None:
        found = list_segments(self.directory, None, file_name=self.config.file_name)
        scans = [scan_segment(seg) for seg in found]
        for i, scan in enumerate(scans):
            if scan.stop_reason == STOP_END:
                continue
            if i == len(scans) - 1:
                _cut_torn_tail(scan, self.config.durable)
            else:  # not written since an earlier process closed it: leave the evidence
                logger.warning(
                    "older WAL file %s is unreadable after byte %d (%s frame, offset %s)",
                    scan.segment.path, scan.safe_end, scan.stop_reason, scan.stop_offset,
                )
        scanned = [scan.segment for scan in scans]
        self._max_seq = max((s.seq for s in scanned), default=-1)
        # Re-sorted on the real first offsets: a bad first frame may have misplaced a file.
        self._rotated = sorted(
            (s for s in scanned if s.last_offset is not None), key=lambda s: (s.first_offset, s.seq)
        )
        if scanned and scanned[-1].last_offset is None and scanned[-1].seq == self._max_seq:
            self._open_active(scanned[-1].seq)
        else:
            self._open_active(self._max_seq + 1)
        lasts = [s.last_offset for s in self._rotated if s.last_offset is not None]  # all of them
        if lasts:
            self._last_flushed = max(lasts)
            self._next_offset = self._last_flushed + 1
        if initial_offset is not None:
            self._apply_initial_offset(initial_offset)
        logger.info(
            "WAL %s opened: %d segment(s) on disk, next offset %d, writing %s",
            self.directory, len(self._rotated), self._next_offset, self._active_path,
        )
        if self._last_flushed is not None:
            self._publish_checkpoint(self._build_checkpoint_locked())

    def _apply_initial_offset(self, initial_offset: int) -> None:
        if initial_offset < self._next_offset:
            logger.warning(
                "WAL %s: initial offset %d is below the next offset %d found on disk; "
                "continuing at %d so no offset is reused",
                self.directory, initial_offset, self._next_offset, self._next_offset,
            )
        self._next_offset = max(self._next_offset, initial_offset)

    def _open_active(self, seq: int) -> None:
        """Make `wal.<seq>.log` the active file. Caller holds the locks (or is `open`)."""
        self._active_seq = seq
        self._active_path = os.path.join(self.directory, segment_file_name(seq, self.config.file_name))
        # Unbuffered: a flush is one write(2) loop we can undo if it fails half way.
        self._fh = open(self._active_path, "ab", buffering=0)
        if self.config.durable:
            _fsync_dir(self.directory)
        self._max_seq = max(self._max_seq, seq)
        self._active_bytes = 0
        self._active_first: int | None = None
        self._active_last: int | None = None  # last offset written to the active file
        self._active_opened_at = self._clock()

    # ---- writing ------------------------------------------------------------------------

    def append(self, msg: StreamMessage) -> int:
        """Give `msg` the next offset, add its frame to the batch; returns the offset."""
        while True:
            with self._lock:
                self._check_open()
                if not self._rotation_due_locked():
                    offset, flush_now = self._add_locked(msg)
                    break
            self._rotate()
        if flush_now:
            self.flush()
        return offset

    def _check_open(self) -> None:
        if self._closed:
            raise DanubeError(f"WAL {self.directory} is closed")

    def _add_locked(self, msg: StreamMessage) -> tuple[int, bool]:
        offset = self._next_offset
        stamped = with_offset(msg, offset)
        payload = encode_message(stamped)
        self._batch += encode_frame(offset, payload)
        self._batch_last = offset
        self._active_bytes += FRAME_HEADER_SIZE + len(payload)
        if self._active_first is None:
            self._active_first = offset
        self._recent.append((offset, stamped))
        self._next_offset = offset + 1
        self._cond.notify_all()
        return offset, len(self._batch) >= self.config.max_batch_bytes

    def _rotation_due_locked(self) -> bool:
        # An empty file is never rotated away, so time rotation cannot pile up empty files.
        if self._active_bytes == 0:
            return False
        cfg = self.config
        if cfg.rotate_max_bytes is not None and self._active_bytes >= cfg.rotate_max_bytes:
            return True
        return (
            cfg.rotate_max_seconds is not None
            and self._clock() - self._active_opened_at >= cfg.rotate_max_seconds
        )

    def _rotate(self) -> None:
        with self._io_lock:
            with self._lock:
                if self._closed or not self._rotation_due_locked():
                    return
            self._write_batch()
            with self._lock:
                self._fh.close()
                self._rotated.append(self._active_segment_locked())
                self._open_active(self._max_seq + 1)
                checkpoint = self._build_checkpoint_locked()
            logger.info("WAL %s rotated to %s", self.directory, self._active_path)
            self._publish_checkpoint(checkpoint)

    def flush(
        self, on_durable: Callable[[int], None] | None = None, *, write_checkpoint: bool = True
    ) -> int | None:
        """Write the batch (fsync if durable) and `wal.ckpt`; returns the last flushed offset.

        `on_durable(last_offset)` is called once the batch's frames are in the file (fsynced
        when durable) and before `wal.ckpt` is rewritten: recovery scans the files, not the
        checkpoint, so a publish can be acknowledged without waiting for the checkpoint's two
        extra fsyncs. It is not called when the batch was empty.

        `write_checkpoint=False` (the group commit, broker/durable_ack.py) updates the
        in-memory checkpoint only and leaves the file to the next periodic flush, at most
        `fsync_interval_ms` later, the broker's own cadence: a commit per loop turn would
        otherwise pay two more fsyncs each. A flush with `write_checkpoint=True` writes a
        pending checkpoint even when the batch is empty.

        An OSError from the disk propagates; the batch is kept and retried by the next flush.
        """
        with self._io_lock:
            self._write_batch(on_durable, write_checkpoint)
        with self._lock:
            return self._last_flushed

    def _write_batch(
        self, on_durable: Callable[[int], None] | None = None, write_checkpoint: bool = True
    ) -> None:
        """Caller holds `_io_lock`, never `_lock`: appends go on while the disk works."""
        with self._lock:
            data, last, pending = self._batch, self._batch_last, self._checkpoint_pending
            if data:
                self._batch = bytearray()
        if not data:
            if write_checkpoint and pending is not None:
                self._publish_checkpoint(pending)
            return
        assert last is not None, "a non-empty batch holds at least one frame, so a last offset"
        self._append_to_file(data)
        self.flush_count += 1
        with self._lock:
            self._last_flushed = self._active_last = last
            while len(self._recent) > self.config.cache_capacity and self._recent[0][0] <= last:
                self._recent.popleft()
            checkpoint = self._build_checkpoint_locked()
        if on_durable is not None:
            on_durable(last)
        if write_checkpoint:
            self._publish_checkpoint(checkpoint)
        else:
            with self._lock:
                self._checkpoint = self._checkpoint_pending = checkpoint

    def _append_to_file(self, data: bytearray) -> None:
        """All of `data` or nothing: on an OSError the file is cut back and the batch kept."""
        fd = self._fh.fileno()
        size_before = os.fstat(fd).st_size
        view = memoryview(data)
        try:
            while view:
                view = view[self._fh.write(view):]
            if self.config.durable:
                os.fsync(fd)
                self.fsync_count += 1
        except OSError:
            try:
                os.ftruncate(fd, size_before)
            except OSError:
                logger.exception("WAL %s: cannot cut back a failed write", self._active_path)
            with self._lock:
                self._batch[:0] = data  # retried by the next flush, in offset order
            raise

    def _publish_checkpoint(self, checkpoint: WalCheckpoint) -> None:
        write_checkpoint(self._ckpt_path, checkpoint.encode(), fsync=self.config.durable)
        if self.config.durable:
            self.fsync_count += 2  # the checkpoint file and the directory
        with self._lock:
            self._checkpoint = checkpoint
            self._checkpoint_pending = None

    def _active_segment_locked(self) -> WalSegment:
        first = self._active_first if self._active_last is not None else None
        return WalSegment(self._active_seq, self._active_path, first, self._active_last)

    def _first_on_disk_locked(self) -> int:
        live = [*self._rotated, self._active_segment_locked()]
        firsts = [s.first_offset for s in live if s.first_offset is not None]
        return min(firsts, default=self._next_offset)

    def _build_checkpoint_locked(self) -> WalCheckpoint:
        # Built only once a frame is flushed; a file is rotated (or kept as rotated on
        # recovery) only once it holds a frame, so every rotated file has a first offset.
        assert self._last_flushed is not None, "a checkpoint is built only after a flush"
        rotated_files = []
        for s in self._rotated:
            assert s.first_offset is not None, f"rotated WAL file {s.path} holds no frame"
            rotated_files.append((s.seq, s.path, s.first_offset))
        return WalCheckpoint(
            start_offset=self._first_on_disk_locked(),
            last_offset=self._last_flushed,
            file_seq=self._active_seq,
            file_path=self._active_path,
            rotated_files=rotated_files,
            active_file_name=os.path.basename(self._active_path),
            last_rotation_at=None,
            active_file_first_offset=self._active_first,
        )

    def _flush_loop(self) -> None:
        interval_s = self.config.fsync_interval_ms / 1000.0
        while not self._stop.wait(interval_s):
            try:
                self.flush()
            except Exception:  # keep flushing: the next tick may succeed (disk full, ...)
                logger.exception("WAL %s: periodic flush failed", self.directory)

    def delete_segments(self, seqs: Iterable[int]) -> list[str]:
        """Delete non-active segments (retention) and record it in `wal.ckpt`; returns paths.

        The active segment cannot be deleted (ValueError naming it).
        """
        wanted = set(seqs)
        with self._io_lock:
            with self._lock:
                if self._active_seq in wanted:
                    raise ValueError(f"WAL segment {self._active_path} is active and cannot be deleted")
                doomed = [s for s in self._rotated if s.seq in wanted]
                self._rotated = [s for s in self._rotated if s.seq not in wanted]
            for seg in doomed:
                try:
                    os.remove(seg.path)
                except FileNotFoundError:
                    logger.warning("WAL segment %s was already gone", seg.path)
            with self._lock:
                checkpoint = self._build_checkpoint_locked() if self._last_flushed is not None else None
            if checkpoint is not None:
                self._publish_checkpoint(checkpoint)
        return [s.path for s in doomed]

    # ---- reading ------------------------------------------------------------------------

    @property
    def next_offset(self) -> int:
        """Offset the next append gets (the head)."""
        with self._lock:
            return self._next_offset

    @property
    def last_flushed_offset(self) -> int | None:
        """Last offset known to be in a file (inclusive), None if nothing is."""
        with self._lock:
            return self._last_flushed

    @property
    def checkpoint(self) -> WalCheckpoint | None:
        """The last `wal.ckpt` written (None before the first flush of a new WAL)."""
        with self._lock:
            return self._checkpoint

    def segments(self) -> list[WalSegment]:
        """Live segments in offset order; the active one last."""
        with self._lock:
            return [*self._rotated, self._active_segment_locked()]

    def wait_for(self, offset: int, timeout_s: float) -> bool:
        """Block until `offset` has been appended (`next_offset > offset`) or the timeout."""
        with self._cond:
            self._cond.wait_for(lambda: self._next_offset > offset or self._closed, timeout_s)
            return self._next_offset > offset

    def read(self, from_offset: int) -> Generator[StreamMessage, None, None]:
        """Messages from `from_offset` up to the head at call time: files, then memory.

        Offsets below the first one on disk, or lost to corruption, are skipped with a
        warning; no offset is yielded twice.
        """
        with self._lock:
            end = self._next_offset
        return self._read_range(from_offset, end)

    def _read_range(self, pos: int, end: int) -> Generator[StreamMessage, None, None]:
        while pos < end:
            with self._lock:
                mem_first = self._recent[0][0] if self._recent else end
                if mem_first <= pos:
                    start = pos - mem_first
                    cached = [m for _o, m in islice(self._recent, start, start + end - pos)]
                else:
                    cached, segments = None, [*self._rotated, self._active_segment_locked()]
            if cached is not None:
                yield from cached
                return
            # Everything below mem_first is flushed: the files hold it.
            pos = yield from self._read_files(segments, pos, min(mem_first, end))

    def _read_files(
        self, segments: list[WalSegment], pos: int, stop: int
    ) -> Generator[StreamMessage, None, int]:
        """Yield what the files hold in `[pos, stop)`; returns `stop` (all of it was looked at)."""
        floor = min((s.first_offset for s in segments if s.first_offset is not None), default=stop)
        if pos < min(floor, stop):
            logger.info(
                "WAL %s: offsets from %d are below the first offset on disk (%d); reading from there",
                self.directory, pos, floor,
            )
        expected = max(pos, floor)
        for msg in read_segments(segments, pos, stop):
            offset = msg.msg_id.topic_offset
            if offset > expected:
                self._warn_gap(expected, offset)
            yield msg
            expected = offset + 1
        if expected < stop:
            self._warn_gap(expected, stop)
        return stop

    def _warn_gap(self, first_missing: int, next_present: int) -> None:
        logger.warning(
            "WAL %s: offsets %d..%d are missing from its files (corrupt or deleted); skipped",
            self.directory, first_missing, next_present - 1,
        )

    # ---- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        """Flush, stop the flusher and close the file. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._stop.set()
        self._flusher.join()
        with self._io_lock:
            self._write_batch()
            self._fh.close()

    def __enter__(self) -> "Wal":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
