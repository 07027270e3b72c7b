"""`wal.ckpt` and `uploader.ckpt` (spec §3.4, §3.5) and their atomic writes.

Both are bincode `standard()` structs. The broker writes `<dir>/wal.tmp` / `<dir>/uploader.tmp`
(the checkpoint path with its extension swapped to `.tmp`) and renames it over the checkpoint,
so a reader sees either the old or the new file, never a torn one. The broker never fsyncs;
`write_checkpoint(fsync=True)` adds that durability for our own writer when configured.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TypeVar

from danube_core.bincode import BincodeReader, BincodeWriter
from danube_core.errors import CheckpointError, PayloadDecodeError

WAL_CHECKPOINT_NAME = "wal.ckpt"
UPLOADER_CHECKPOINT_NAME = "uploader.ckpt"


@dataclass
class WalCheckpoint:
    """The WAL writer's view of its files. `last_offset` is inclusive.

    `rotated_files` holds `(seq, path, first_offset)` for rotations done by the writing
    process only; `start_offset` is 0 except briefly after a deleter cycle (§3.7).
    """

    start_offset: int
    last_offset: int
    file_seq: int
    file_path: str
    rotated_files: list[tuple[int, str, int]] = field(default_factory=list)
    active_file_name: str | None = None
    last_rotation_at: int | None = None
    active_file_first_offset: int | None = None

    def encode(self) -> bytes:
        w = BincodeWriter()
        w.varint(self.start_offset)
        w.varint(self.last_offset)
        w.varint(self.file_seq)
        w.string(self.file_path)
        w.varint(len(self.rotated_files))
        for seq, path, first_offset in self.rotated_files:
            w.varint(seq)
            w.string(path)
            w.varint(first_offset)
        w.option(self.active_file_name, w.string)
        w.option(self.last_rotation_at, w.varint)
        w.option(self.active_file_first_offset, w.varint)
        return w.getvalue()

    @classmethod
    def decode(cls, data: bytes, source: str) -> "WalCheckpoint":
        """Decode `data` read from `source`; trailing bytes are ignored as in the broker."""
        r = BincodeReader(data)
        try:
            start_offset = r.varint(64, "start_offset")
            last_offset = r.varint(64, "last_offset")
            file_seq = r.varint(64, "file_seq")
            file_path = r.string("file_path")
            count = r.varint(64, "rotated_files")
            rotated = [
                (r.varint(64, "rotated_files.seq"), r.string("rotated_files.path"),
                 r.varint(64, "rotated_files.first_offset"))
                for _ in range(count)
            ]
            return cls(
                start_offset=start_offset,
                last_offset=last_offset,
                file_seq=file_seq,
                file_path=file_path,
                rotated_files=rotated,
                active_file_name=r.option(lambda: r.string("active_file_name"), "active_file_name"),
                last_rotation_at=r.option(lambda: r.varint(64, "last_rotation_at"), "last_rotation_at"),
                active_file_first_offset=r.option(
                    lambda: r.varint(64, "active_file_first_offset"), "active_file_first_offset"
                ),
            )
        except PayloadDecodeError as exc:
            raise CheckpointError(f"corrupt WAL checkpoint {source}: {exc}") from exc


@dataclass
class UploaderCheckpoint:
    """Uploader progress. A missing file means the defaults: start at seq 0, byte 0.

    `last_committed_offset` is the inclusive end offset of the last uploaded object;
    `updated_at` is Unix seconds.
    """

    last_committed_offset: int = 0
    last_read_file_seq: int = 0
    last_read_byte_position: int = 0
    last_object_id: str | None = None
    updated_at: int = 0

    def encode(self) -> bytes:
        w = BincodeWriter()
        w.varint(self.last_committed_offset)
        w.varint(self.last_read_file_seq)
        w.varint(self.last_read_byte_position)
        w.option(self.last_object_id, w.string)
        w.varint(self.updated_at)
        return w.getvalue()

    @classmethod
    def decode(cls, data: bytes, source: str) -> "UploaderCheckpoint":
        """Decode `data` read from `source`; trailing bytes are ignored as in the broker."""
        r = BincodeReader(data)
        try:
            return cls(
                last_committed_offset=r.varint(64, "last_committed_offset"),
                last_read_file_seq=r.varint(64, "last_read_file_seq"),
                last_read_byte_position=r.varint(64, "last_read_byte_position"),
                last_object_id=r.option(lambda: r.string("last_object_id"), "last_object_id"),
                updated_at=r.varint(64, "updated_at"),
            )
        except PayloadDecodeError as exc:
            raise CheckpointError(f"corrupt uploader checkpoint {source}: {exc}") from exc


C = TypeVar("C", WalCheckpoint, UploaderCheckpoint)


def temp_path_for(path: str) -> str:
    """`<dir>/wal.ckpt` -> `<dir>/wal.tmp`: the broker swaps the extension, it does not append."""
    return os.path.splitext(path)[0] + ".tmp"


def write_checkpoint(path: str, data: bytes, fsync: bool) -> None:
    """Atomically replace `path` with `data` through the `.tmp` sibling.

    With `fsync` the file is synced before the rename and the directory after it, so the
    rename itself survives a crash. Raises CheckpointError naming the file.
    """
    tmp = temp_path_for(path)
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
        if fsync:
            _fsync_dir(os.path.dirname(path) or ".")
    except OSError as exc:
        raise CheckpointError(f"cannot write checkpoint {path} (via {tmp}): {exc}") from exc


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_checkpoint(path: str, cls: type[C]) -> C | None:
    """Read and decode a checkpoint file; None if it does not exist.

    Raises CheckpointError naming the file if it cannot be read or is corrupt.
    """
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from exc
    return cls.decode(data, path)
