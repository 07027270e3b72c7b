"""Group commit (broker/durable_ack.py): an ack means the frame is in the file, one flush per loop turn."""

from __future__ import annotations

import asyncio
import os

from broker.durable_ack import FlushWaiter
from danube_core.checkpoints import WAL_CHECKPOINT_NAME, WalCheckpoint, read_checkpoint
from danube_core.frames import scan_frames
from tests.rig import eventually
from tests.unit.test_wal import make_msg, open_wal


def _offsets_in_file(wal) -> list[int]:
    with open(wal.segments()[-1].path, "rb") as fh:
        return [f.offset for f in scan_frames(fh.read()).frames]


def test_sends_of_one_loop_turn_share_one_flush_and_resolve_only_once_on_disk(tmp_path):
    wal = open_wal(tmp_path, durable=True)

    async def scenario() -> list[int]:
        waiter = FlushWaiter(wal, asyncio.get_running_loop(), "t")
        seen_on_disk: list[int] = []
        futures = []
        for i in range(64):  # one loop turn: no await between the appends
            offset = wal.append(make_msg(i))
            future = waiter.wait(offset)
            future.add_done_callback(lambda _f, o=offset: seen_on_disk.append(
                o if o in _offsets_in_file(wal) else -1))
            futures.append(future)
        await asyncio.wait_for(asyncio.gather(*futures), 30)
        await asyncio.to_thread(waiter.close)
        return seen_on_disk

    seen = asyncio.run(scenario())
    assert sorted(seen) == list(range(64)), "a send was acknowledged before its frame was in the file"
    assert wal.flush_count == 1
    wal.close()


def test_acked_sends_reach_wal_ckpt_with_the_periodic_flush(tmp_path):
    wal = open_wal(tmp_path, durable=True, fsync_interval_ms=10)
    ckpt_path = os.path.join(wal.directory, WAL_CHECKPOINT_NAME)

    async def scenario() -> None:
        waiter = FlushWaiter(wal, asyncio.get_running_loop(), "t")
        offsets = [wal.append(make_msg(i)) for i in range(5)]
        await asyncio.wait_for(asyncio.gather(*(waiter.wait(o) for o in offsets)), 30)
        assert _offsets_in_file(wal)[-1] == offsets[-1]
        await asyncio.to_thread(waiter.close)

    asyncio.run(scenario())
    eventually(lambda: os.path.exists(ckpt_path)
               and read_checkpoint(ckpt_path, WalCheckpoint).last_offset == 4, 30)
    wal.close()


def test_a_failed_flush_fails_the_waiting_sends(tmp_path):
    wal = open_wal(tmp_path, durable=True)

    class FullDisk:
        """The WAL file whose writes fail: the WAL must keep the batch for the next flush."""

        def __init__(self, fh) -> None:
            self.fh = fh

        def fileno(self) -> int:
            return self.fh.fileno()

        def write(self, data) -> int:
            raise OSError(28, "No space left on device")

    real_file = wal._fh
    wal._fh = FullDisk(real_file)

    async def scenario() -> BaseException | None:
        waiter = FlushWaiter(wal, asyncio.get_running_loop(), "t")
        future = waiter.wait(wal.append(make_msg(0)))
        try:
            await asyncio.wait_for(future, 30)
        except OSError as exc:
            return exc
        finally:
            await asyncio.to_thread(waiter.close)
        return None

    error = asyncio.run(scenario())
    assert isinstance(error, OSError) and "No space left" in str(error)
    wal._fh = real_file  # the disk is back: the kept batch reaches the file on close
    wal.close()
    assert _offsets_in_file(wal) == [0]


def test_group_commit_leaves_wal_ckpt_to_the_periodic_flush_and_close(tmp_path):
    wal = open_wal(tmp_path, durable=True)  # no periodic flush during the test
    wal.append(make_msg(0))
    assert wal.flush(write_checkpoint=False) == 0
    assert wal.checkpoint is not None and wal.checkpoint.last_offset == 0  # in memory at once
    ckpt_path = os.path.join(wal.directory, WAL_CHECKPOINT_NAME)
    assert not os.path.exists(ckpt_path)
    assert wal.flush() == 0  # nothing to write but the pending checkpoint
    assert read_checkpoint(ckpt_path, WalCheckpoint).last_offset == 0
    wal.append(make_msg(1))
    wal.flush(write_checkpoint=False)
    wal.close()
    assert read_checkpoint(ckpt_path, WalCheckpoint).last_offset == 1
