"""Subscription cursors: the last acknowledged offset of a reliable subscription (spec §5.3).

The cursor lives at `/topics{T}/subscriptions/{sub}/cursor` as a bare JSON number and is
**inclusive**: a subscription resumes at `cursor + 1`; without a cursor it starts at Latest.
Writing etcd on every ack would put one write per message on the metadata store, so acks are
batched: the cursor is written every `flush_every_acks` acks or when `flush_interval_s` has
passed since the last write (seed 003's "every 1000 acks or 5 seconds"; the v0.7.3 code only
has the time rule, see §5.3). Like the broker there is no background timer: a quiet
subscription's newest ack waits for the next ack or a forced `flush()` (unload, close).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from danube_core.keys import TopicLike, cursor_key
from danube_core.metadata import MetadataStore
from danube_core.records import dump_cursor, parse_cursor

logger = logging.getLogger(__name__)


class SubscriptionCursor:
    """One subscription's acknowledged position, flushed to etcd in batches.

    Acks only move the cursor forward: a late or duplicate ack for an offset at or below the
    current cursor changes nothing, so a flushed cursor never goes backwards. Thread-safe.
    """

    def __init__(
        self,
        metadata: MetadataStore,
        topic: TopicLike,
        subscription: str,
        *,
        flush_every_acks: int = 1000,
        flush_interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if flush_every_acks < 1:
            raise ValueError(f"flush_every_acks={flush_every_acks!r} must be >= 1")
        if flush_interval_s < 0:
            raise ValueError(f"flush_interval_s={flush_interval_s!r} must be >= 0")
        self._metadata = metadata
        self._key = cursor_key(topic, subscription)
        self._flush_every_acks = flush_every_acks
        self._flush_interval_s = flush_interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._acked: int | None = None
        self._flushed: int | None = None
        self._acks_since_flush = 0
        self._last_flush_at = clock()

    @property
    def key(self) -> str:
        return self._key

    @property
    def acked_offset(self) -> int | None:
        """Last acknowledged offset in memory (may be ahead of etcd until the next flush)."""
        return self._acked

    def load(self) -> int | None:
        """Read the stored cursor (inclusive last acked offset); None if the key is absent.

        The in-memory cursor only moves forward, so loading never undoes newer local acks.
        """
        raw = self._metadata.get(self._key)
        stored = None if raw is None else parse_cursor(raw, self._key)
        with self._lock:
            if stored is not None and (self._acked is None or stored > self._acked):
                self._acked = stored
                self._flushed = stored
        return stored

    def ack(self, offset: int) -> None:
        """Record that every message up to `offset` (inclusive) is acknowledged; write it to
        etcd when a flush is due (every `flush_every_acks` acks or `flush_interval_s`)."""
        if self.record(offset):
            self.flush()

    def record(self, offset: int) -> bool:
        """Record the ack in memory only (never blocks on etcd); True when a flush is due.

        For callers on an event loop, which then run `flush()` on a thread.
        """
        if offset < 0:
            raise ValueError(f"ack offset {offset} for {self._key} must be >= 0")
        with self._lock:
            if self._acked is not None and offset <= self._acked:
                return False
            self._acked = offset
            self._acks_since_flush += 1
            return (
                self._acks_since_flush >= self._flush_every_acks
                or self._clock() - self._last_flush_at >= self._flush_interval_s
            )

    def flush(self) -> None:
        """Write the newest acked offset now (topic unload or close); no-op if unchanged."""
        with self._lock:
            self._write_locked()

    def resume_offset(self) -> int | None:
        """First offset to deliver: cursor + 1, or None meaning "Latest" (no cursor yet)."""
        with self._lock:
            return None if self._acked is None else self._acked + 1

    def _write_locked(self) -> None:
        if self._acked is not None and self._acked != self._flushed:
            self._metadata.put(self._key, dump_cursor(self._acked))
            logger.debug("cursor %s flushed at %d", self._key, self._acked)
            self._flushed = self._acked
        self._acks_since_flush = 0
        self._last_flush_at = self._clock()
