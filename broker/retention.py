"""Local WAL retention: delete old segments once they are safely in the cloud (spec §3.7).

The broker's deleter picks files by seq (`seq < uploader.last_read_file_seq`). Here a segment
is a candidate only if **every** offset in it is at or below the uploader's
`last_committed_offset` (its object is uploaded and recorded in etcd), so nothing that is not
uploaded is ever deleted, whatever the file seqs look like after restarts. The active segment is
never a candidate. Among candidates, the time rule deletes those older than `max_age_s` (file
mtime) and the size rule deletes the oldest until all WAL files together fit `max_total_bytes`.

Deletion goes through `Wal.delete_segments`, so `wal.ckpt` (`start_offset`, `rotated_files`)
is updated by the writer itself and not overwritten by its next flush, unlike in the broker.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable

from danube_core.checkpoints import UploaderCheckpoint, read_checkpoint
from danube_core.wal_files import WalSegment

from broker.periodic import PeriodicTask
from broker.wal import Wal

logger = logging.getLogger(__name__)


class WalRetention:
    """Deletes uploaded WAL segments of one topic by age and/or total size.

    With neither `max_age_s` nor `max_total_bytes` set, nothing is ever deleted. `clock`
    returns Unix seconds, compared with file mtimes.
    """

    def __init__(
        self,
        wal: Wal,
        *,
        uploader_checkpoint_path: str,
        max_age_s: float | None,
        max_total_bytes: int | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_age_s is not None and max_age_s < 0:
            raise ValueError(f"retention max_age_s={max_age_s!r} must be None (off) or >= 0")
        if max_total_bytes is not None and max_total_bytes < 0:
            raise ValueError(f"retention max_total_bytes={max_total_bytes!r} must be None (off) or >= 0")
        self._wal = wal
        self._uploader_checkpoint_path = uploader_checkpoint_path
        self._max_age_s = max_age_s
        self._max_total_bytes = max_total_bytes
        self._clock = clock
        self._task = PeriodicTask(f"wal-retention-{wal.topic}", self._logged_cycle)

    def run_once(self) -> list[str]:
        """One retention cycle; returns the paths it deleted."""
        committed = self._committed_offset()
        if committed is None:
            return []
        segments = self._wal.segments()
        stats = _file_stats(segments)
        uploaded = [
            s for s in segments[:-1]  # the active segment (last) is never deleted
            if s.path in stats and s.last_offset is not None and s.last_offset <= committed
        ]
        chosen = self._by_age(uploaded, stats)
        chosen += self._by_size(uploaded, stats, chosen)
        if not chosen:
            return []
        deleted = self._wal.delete_segments(s.seq for s in chosen)
        logger.info(
            "WAL retention for %s deleted %d segment(s) up to offset %d: %s",
            self._wal.directory, len(deleted), max(s.last_offset for s in chosen if s.last_offset is not None), deleted,
        )
        return deleted

    def _committed_offset(self) -> int | None:
        ckpt = read_checkpoint(self._uploader_checkpoint_path, UploaderCheckpoint)
        # Without an uploaded object, last_committed_offset 0 does not mean offset 0 is uploaded.
        if ckpt is None or ckpt.last_object_id is None:
            return None
        return ckpt.last_committed_offset

    def _by_age(
        self, uploaded: list[WalSegment], stats: dict[str, os.stat_result]
    ) -> list[WalSegment]:
        if self._max_age_s is None:
            return []
        cutoff = self._clock() - self._max_age_s
        return [s for s in uploaded if stats[s.path].st_mtime <= cutoff]

    def _by_size(
        self,
        uploaded: list[WalSegment],
        stats: dict[str, os.stat_result],
        already: list[WalSegment],
    ) -> list[WalSegment]:
        if self._max_total_bytes is None:
            return []
        total = sum(st.st_size for st in stats.values()) - sum(stats[s.path].st_size for s in already)
        extra = []
        for seg in uploaded:  # offset order: oldest first
            if total <= self._max_total_bytes:
                break
            if seg not in already:
                extra.append(seg)
                total -= stats[seg.path].st_size
        return extra

    def start(self, interval_s: float) -> None:
        """Run a cycle now and then every `interval_s` seconds in a daemon thread."""
        self._task.start(interval_s)

    def stop(self) -> None:
        """Stop the background thread (waits for a running cycle)."""
        self._task.stop()

    def _logged_cycle(self) -> None:
        try:
            self.run_once()
        except Exception:  # a failed cycle (unreadable checkpoint, I/O) is retried next time
            logger.exception("WAL retention cycle for %s failed", self._wal.directory)


def _file_stats(segments: list[WalSegment]) -> dict[str, os.stat_result]:
    stats = {}
    for seg in segments:
        try:
            stats[seg.path] = os.stat(seg.path)
        except FileNotFoundError:
            continue
    return stats
