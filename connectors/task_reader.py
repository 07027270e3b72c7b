"""Executor side: one `ReadTask` -> Arrow record batches, in bounded memory.

The task's byte range is streamed with ranged reads of `chunk_bytes` (8 MiB by default), so a
task holds about one chunk, whatever the object's size (or one frame, if a frame is larger).
Each read starts at a frame boundary: a frame cut by a chunk's end is read again with the
next chunk. Every chunk goes through the C decoder
(`danube_core.arrow_decode.decode_frames`), which checks every CRC and drops frames outside
the task's offsets (a task may start at an index entry before its first offset).

What can go wrong, and what happens (spec §1.4):
* a CRC or payload error in an object (`strict`): corruption -> `CorruptFrameError` naming the
  object URL, offset and byte, handed to the data-loss policy (fail, or skip the rest);
* a WAL task (`strict=False`) stops quietly at a torn or corrupt tail, like the broker's WAL
  reader; offsets it then misses are data loss like any other;
* offsets must come out contiguous over `[start_offset, end_offset)`: a missing offset or a
  missing object is data loss; a repeated or lower offset is dropped (never read twice).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from connectors.data_loss import LostRange, report
from connectors.read_task import ReadTask
from danube_core.errors import CorruptFrameError, ObjectMissingError

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

logger = logging.getLogger(__name__)

CHUNK_BYTES = 8 * 1024 * 1024
SOURCE_COLUMN = "source"
_OFFSET = "offset"
_CORRUPT_STOPS = ("crc", "decode")

LossSink = Callable[[LostRange], None]


def read_task(
    task: ReadTask,
    columns: Sequence[str] | None = None,
    *,
    chunk_bytes: int = CHUNK_BYTES,
    on_loss: LossSink | None = None,
) -> Iterator["pa.RecordBatch"]:
    """Yield the task's messages as batches of `MESSAGE_ARROW_SCHEMA` columns, in offset order.

    `columns` selects decoder columns (all when None) and may include `"source"`, a string
    column holding `task.source` (the object id or "wal"). With failOnDataLoss=false, every
    lost range is logged and passed to `on_loss`, so callers can count it.
    """
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes={chunk_bytes}: expected an integer >= 1")
    return _TaskReader(task, columns, chunk_bytes, on_loss).batches()


def _check_wal_dir_here(url: str, cause: BaseException) -> None:
    """A missing WAL *directory* on this host is a walRoot that executors cannot see (a local
    path on the broker's host, or a volume not mounted here), not data that was lost."""
    import os
    import socket
    from urllib.parse import unquote, urlsplit

    from danube_core.errors import WalUnreachableError

    parts = urlsplit(url)
    if parts.scheme not in ("", "file"):
        return
    directory = os.path.dirname(unquote(parts.path))
    if not os.path.isdir(directory):
        raise WalUnreachableError(
            f"WAL directory {directory} does not exist on host {socket.gethostname()}, where this "
            f"Spark task runs ({url} was planned on the driver). A file:// walRoot must be a volume "
            "that every executor mounts at the same path; otherwise serve each broker's WAL over "
            "HTTP (python -m broker.wal_http) and set walRoot to a map of broker ids to those URLs"
        ) from cause


class _TaskReader:
    """State of one task's read: the next expected offset."""

    def __init__(
        self, task: ReadTask, columns: Sequence[str] | None, chunk_bytes: int, on_loss: LossSink | None
    ) -> None:
        from danube_core.arrow_decode import MESSAGE_ARROW_SCHEMA

        self.task = task
        wanted = list(MESSAGE_ARROW_SCHEMA.names) if columns is None else list(columns)
        self.with_source = SOURCE_COLUMN in wanted
        self.output = [name for name in wanted if name != SOURCE_COLUMN]
        self.decode_columns = self.output if _OFFSET in self.output else [_OFFSET, *self.output]
        self.chunk_bytes = chunk_bytes
        self.on_loss = on_loss
        self.next_offset = task.start_offset

    def _lose(self, start: int, stop: int, reason: str, cause: BaseException | None = None) -> None:
        lost = report(self.task.topic, start, stop, reason, source=self.task.url,
                      fail_on_data_loss=self.task.fail_on_data_loss, cause=cause)
        if self.on_loss is not None:
            self.on_loss(lost)

    def batches(self) -> Iterator["pa.RecordBatch"]:
        from danube_core.objectstore import ObjectStore

        task = self.task
        if task.start_offset >= task.end_offset:
            return
        store = ObjectStore.from_url(task.url, task.storage_options)
        try:
            yield from self._stream(store)
        except ObjectMissingError as exc:
            if task.is_wal:
                _check_wal_dir_here(task.url, exc)
            self._lose(self.next_offset, task.end_offset,
                       f"{'WAL file' if task.is_wal else 'object'} {task.url} does not exist", exc)
            return
        if self.next_offset < task.end_offset:
            what = "the WAL file's readable part" if task.is_wal else "the object's byte range"
            self._lose(self.next_offset, task.end_offset,
                       f"{what} [{task.byte_start}, {task.byte_end}) of {task.url} ends before "
                       f"offset {self.next_offset}")

    def _stream(self, store) -> Iterator["pa.RecordBatch"]:
        """Read the byte range in chunks that start at frame boundaries.

        Each read starts where the last whole frame ended, so a frame cut by a chunk's end is
        read again with the next chunk instead of being carried over (copying every chunk
        behind it); a frame longer than a chunk doubles the read until it fits.
        """
        from danube_core.arrow_decode import decode_frames

        task = self.task
        end = task.byte_end if task.byte_end is not None else store.size(task.url)
        pos, want = task.byte_start, self.chunk_bytes
        while pos < end and self.next_offset < task.end_offset:
            stop = min(end, pos + want)
            data = store.read_range(task.url, pos, stop)
            if not data:
                break  # the file is shorter than planned; the caller reports what is missing
            decoded = decode_frames(data, base_pos=pos, min_offset=task.start_offset,
                                    max_offset=task.end_offset - 1, columns=self.decode_columns)
            batch = self._contiguous(decoded.batch)
            if batch.num_rows:
                yield self._shaped(batch)
            if self.next_offset >= task.end_offset:
                return
            if decoded.stop_reason in _CORRUPT_STOPS:
                self._corrupt(decoded)
                return
            if decoded.consumed == 0:
                if stop >= end or len(data) < stop - pos:
                    break  # the range or the file ends inside this frame: reported by the caller
                want *= 2  # one frame longer than the read
                continue
            pos, want = pos + decoded.consumed, self.chunk_bytes

    def _corrupt(self, decoded) -> None:
        task = self.task
        error = CorruptFrameError(task.url, decoded.stop_offset, decoded.stop_pos, decoded.stop_detail)
        if not task.strict:
            logger.warning("WAL read of %s stops at a %s frame: %s", task.url, decoded.stop_reason, error)
            return
        self._lose(self.next_offset, task.end_offset, str(error), error)
        self.next_offset = task.end_offset  # the rest of this task is reported, not re-reported

    def _contiguous(self, batch: "pa.RecordBatch") -> "pa.RecordBatch":
        """Check the offsets continue at `next_offset`; report gaps, drop repeats."""
        import numpy as np

        n = batch.num_rows
        if n == 0:
            return batch
        offsets = _u64_values(batch.column(_OFFSET))
        first, last = int(offsets[0]), int(offsets[-1])
        if first == self.next_offset and last - first == n - 1 and bool(np.all(np.diff(offsets) == 1)):
            self.next_offset = last + 1
            return batch
        keep = []
        for i, value in enumerate(offsets.tolist()):
            if value < self.next_offset:
                logger.warning("%s: offset %d repeats or goes backwards (expected %d); dropped",
                               self.task.url, value, self.next_offset)
                continue
            if value > self.next_offset:
                self._lose(self.next_offset, value, f"offsets {self.next_offset}..{value - 1} are "
                           f"missing from {self.task.url} (the next frame has offset {value})")
            keep.append(i)
            self.next_offset = value + 1
        return batch.take(keep)

    def _shaped(self, batch: "pa.RecordBatch") -> "pa.RecordBatch":
        import pyarrow as pa

        if self.decode_columns != self.output:
            batch = batch.select(self.output)
        if self.with_source:
            source = pa.repeat(pa.scalar(self.task.source, pa.string()), batch.num_rows)
            batch = batch.append_column(SOURCE_COLUMN, source)
        return batch


def _u64_values(column: "pa.Array") -> "np.ndarray":
    """A null-free u64 column's values as a numpy view (no copy).

    Not `Array.to_numpy()`: pyarrow imports pandas for it, which costs a fresh Python worker
    (and a stream's driver process, which reads publish times for the lag) ~0.4 s of CPU.
    """
    import numpy as np

    data = column.buffers()[1]
    return np.frombuffer(data, dtype="<u8", count=len(column) + column.offset)[column.offset:]
