"""Acknowledge a publish only once its WAL frame is flushed (fsynced when `durable`): group commit.

With `wal_cloud.wal.file_sync.durable: true` a SendMessage is answered after the frame holding
the message is on disk. Waiting for the WAL's periodic flush (`interval_ms`, 5 s by default)
would make every send that slow, so a committer thread flushes as soon as someone waits and the
previous flush is done: while one fsync runs, the next batch collects every message that
arrives meanwhile. Danube acknowledges as soon as the message is in memory (§3.3).

Two choices keep the CPU per message low when many sends are in flight:
* The committer is woken once per event-loop turn, not once per send: every SendMessage the
  loop handles in one turn is appended first, then one flush (one write + one fsync) covers
  them all. Waking it on the first send of a turn would flush that one message alone and pay
  a checkpoint rewrite, a thread switch and a loop wake-up for it.
* Waiters are resolved as soon as the frames are fsynced (`Wal.flush(on_durable=...)`), and the
  commit does not rewrite `wal.ckpt` (two more fsyncs): the WAL's periodic flush writes it, at
  most `interval_ms` later, as often as the broker itself does. Recovery scans the WAL files,
  not the checkpoint, so nothing acknowledged depends on it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading

from broker.wal import Wal

logger = logging.getLogger(__name__)


class FlushWaiter:
    """Futures resolved when the WAL has flushed their offset. `wait` runs on the event loop."""

    def __init__(self, wal: Wal, loop: asyncio.AbstractEventLoop, name: str) -> None:
        self._wal = wal
        self._loop = loop
        self._cond = threading.Condition()
        self._wanted = -1  # guarded by _cond: the committer flushes until this offset is on disk
        self._requested = -1  # event-loop side: the largest offset waited for so far
        self._kick_scheduled = False  # event-loop side: a _kick is queued for this turn
        self._announced = -1  # committer side: the largest offset handed to _resolve
        self._stopping = False
        self._waiters: collections.deque[tuple[int, asyncio.Future]] = collections.deque()
        self._thread = threading.Thread(target=self._run, name=f"flush-waiter-{name}", daemon=True)
        self._thread.start()

    def wait(self, offset: int) -> asyncio.Future:
        """A future that completes when `offset` is flushed (or fails with the flush error)."""
        future = self._loop.create_future()
        self._waiters.append((offset, future))
        if offset > self._requested:
            self._requested = offset
            if not self._kick_scheduled:
                self._kick_scheduled = True
                self._loop.call_soon(self._kick)
        return future

    def _kick(self) -> None:
        """Runs after the handlers of this loop turn: hand the committer everything they appended."""
        self._kick_scheduled = False
        with self._cond:
            if self._requested > self._wanted:
                self._wanted = self._requested
                self._cond.notify()

    def close(self) -> None:
        """Flush what is waited for, resolve it, and stop the thread."""
        with self._cond:
            self._wanted = max(self._wanted, self._requested)
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout=30.0)

    def _run(self) -> None:
        flushed = -1
        while True:
            with self._cond:
                while self._wanted <= flushed and not self._stopping:
                    self._cond.wait()
                if self._wanted <= flushed and self._stopping:
                    return
            try:
                result = self._wal.flush(on_durable=self._announce, write_checkpoint=False)
            except Exception as exc:  # the batch stays in the WAL; waiters learn it is not on disk
                logger.exception("flushing the WAL of %s failed", self._wal.topic)
                self._loop.call_soon_threadsafe(self._fail, exc)
                with self._cond:
                    if self._stopping:
                        return
                    self._cond.wait(0.1)
                continue
            if result is not None and result > flushed:
                flushed = result
                self._announce(flushed)  # also covers what the WAL's periodic flush wrote

    def _announce(self, flushed: int) -> None:
        """Committer thread: let the loop resolve every waiter up to `flushed` (once per offset)."""
        if flushed > self._announced:
            self._announced = flushed
            self._loop.call_soon_threadsafe(self._resolve, flushed)

    def _resolve(self, flushed: int) -> None:
        while self._waiters and self._waiters[0][0] <= flushed:
            _, future = self._waiters.popleft()
            if not future.done():
                future.set_result(None)

    def _fail(self, error: Exception) -> None:
        while self._waiters:
            _, future = self._waiters.popleft()
            if not future.done():
                future.set_exception(error)
