"""wal.ckpt / uploader.ckpt bytes (spec §3.4, §3.5) and atomic writes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from danube_core.checkpoints import (
    UPLOADER_CHECKPOINT_NAME,
    WAL_CHECKPOINT_NAME,
    UploaderCheckpoint,
    WalCheckpoint,
    read_checkpoint,
    temp_path_for,
    write_checkpoint,
)
from danube_core.errors import CheckpointError

WAL_1 = "./danube-data/wal/default/orders/wal.1.log"
WAL_0 = "./danube-data/wal/default/orders/wal.log"


def spec_wal_checkpoint() -> WalCheckpoint:
    return WalCheckpoint(
        start_offset=0, last_offset=1203, file_seq=1, file_path=WAL_1,
        rotated_files=[(0, WAL_0, 0)], active_file_name="wal.1.log",
        last_rotation_at=None, active_file_first_offset=1000,
    )


def spec_wal_bytes() -> bytes:
    return (
        bytes.fromhex("00 fb b3 04 01 2a") + WAL_1.encode()
        + bytes.fromhex("01 00 28") + WAL_0.encode() + bytes.fromhex("00")
        + bytes.fromhex("01 09 77 61 6c 2e 31 2e 6c 6f 67 00 01 fb e8 03")
    )


def test_spec_3_4_wal_checkpoint_bytes() -> None:
    expected = spec_wal_bytes()
    assert len(expected) == 108
    assert spec_wal_checkpoint().encode() == expected
    assert WalCheckpoint.decode(expected, "wal.ckpt") == spec_wal_checkpoint()


def test_spec_3_5_uploader_checkpoint_bytes() -> None:
    ckpt = UploaderCheckpoint(1203, 1, 48213, "data-0-1700000030.dnb1", 1700000031)
    expected = (
        bytes.fromhex("fb b3 04 01 fb 55 bc 01 16") + b"data-0-1700000030.dnb1"
        + bytes.fromhex("fc 1f f1 53 65")
    )
    assert len(expected) == 36
    assert ckpt.encode() == expected
    assert UploaderCheckpoint.decode(expected, "uploader.ckpt") == ckpt


def test_uploader_defaults_and_none_object() -> None:
    assert UploaderCheckpoint().encode() == bytes.fromhex("00 00 00 00 00")
    assert UploaderCheckpoint.decode(bytes(5), "x") == UploaderCheckpoint()


def test_wal_checkpoint_without_options() -> None:
    ckpt = WalCheckpoint(0, 0, 0, "wal.log")
    assert WalCheckpoint.decode(ckpt.encode(), "x") == ckpt


def test_temp_path_swaps_extension() -> None:
    assert temp_path_for("/d/wal.ckpt") == "/d/wal.tmp"
    assert temp_path_for("/d/uploader.ckpt") == "/d/uploader.tmp"


@pytest.mark.parametrize("fsync", [False, True])
def test_write_then_read(tmp_path: Path, fsync: bool) -> None:
    path = str(tmp_path / WAL_CHECKPOINT_NAME)
    write_checkpoint(path, spec_wal_checkpoint().encode(), fsync=fsync)
    assert read_checkpoint(path, WalCheckpoint) == spec_wal_checkpoint()
    assert sorted(os.listdir(tmp_path)) == [WAL_CHECKPOINT_NAME]


def test_write_replaces_existing(tmp_path: Path) -> None:
    path = str(tmp_path / UPLOADER_CHECKPOINT_NAME)
    write_checkpoint(path, UploaderCheckpoint(1).encode(), fsync=False)
    write_checkpoint(path, UploaderCheckpoint(2).encode(), fsync=False)
    loaded = read_checkpoint(path, UploaderCheckpoint)
    assert loaded is not None and loaded.last_committed_offset == 2


def test_missing_checkpoint_is_none(tmp_path: Path) -> None:
    assert read_checkpoint(str(tmp_path / "wal.ckpt"), WalCheckpoint) is None


def test_corrupt_checkpoint_names_file(tmp_path: Path) -> None:
    path = tmp_path / "wal.ckpt"
    path.write_bytes(spec_wal_bytes()[:50])
    with pytest.raises(CheckpointError, match=rf"{path}.*rotated_files"):
        read_checkpoint(str(path), WalCheckpoint)


def test_unwritable_directory_raises_checkpoint_error(tmp_path: Path) -> None:
    path = str(tmp_path / "missing-dir" / "wal.ckpt")
    with pytest.raises(CheckpointError, match="missing-dir"):
        write_checkpoint(path, b"\x00", fsync=False)
