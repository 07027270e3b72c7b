"""Subscription lag over time, for the topic page's chart: a sample of every subscription's
lag (its partition's head, WAL included, minus its cursor: `SubscriptionRow.lag_messages`)
every `interval_s`, the last `samples` kept per (topic partition, subscription), and whether a
subscription is behind and falling further behind (`growing`).

Nothing stores this history elsewhere (etcd holds only the latest record), so the console
keeps it in memory from the moment it starts; the sample reads the etcd cache, never etcd.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Callable, Iterable

from console.topics import SubscriptionRow

logger = logging.getLogger(__name__)

Point = tuple[float, int | None]  # (unix seconds, messages behind)

GROWTH_SAMPLES = 3  # behind in each of the last 3 samples, never less than the sample before


class LagHistory:
    def __init__(self, samples: int) -> None:
        self._samples = samples
        self._series: dict[tuple[str, str], deque[Point]] = {}
        self._lock = threading.Lock()

    def record(self, rows: Iterable[SubscriptionRow], now: float | None = None) -> None:
        at = time.time() if now is None else now
        with self._lock:
            for row in rows:
                series = self._series.setdefault((row.topic, row.name), deque(maxlen=self._samples))
                series.append((at, row.lag_messages))

    def series(self, topic: str, subscription: str) -> list[Point]:
        with self._lock:
            return list(self._series.get((topic, subscription), ()))

    def growing(self, topic: str, subscription: str) -> bool:
        """Behind in each of the last `GROWTH_SAMPLES` samples and more behind in the last than
        the first, never less from one to the next: a consumer that is not keeping up (one
        working through a backlog, or stopped while the backlog only drains, is not)."""
        last = [p[1] for p in self.series(topic, subscription)[-GROWTH_SAMPLES:]]
        if len(last) < GROWTH_SAMPLES or any(m is None or m <= 0 for m in last):
            return False
        counts = [m for m in last if m is not None]
        return counts[-1] > counts[0] and all(b >= a for a, b in zip(counts, counts[1:]))


class LagSampler:
    """A daemon thread recording `rows()` into `history` every `interval_s` until `stop()`."""

    def __init__(self, history: LagHistory, rows: Callable[[], Iterable[SubscriptionRow]], interval_s: float) -> None:
        self.history, self._rows, self._interval_s = history, rows, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="console-lag-sampler", daemon=True)

    def start(self) -> "LagSampler":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.history.record(list(self._rows()))
            except Exception:  # noqa: BLE001 (a bad value must not end the history)
                logger.exception("lag sample failed")
            self._stop.wait(self._interval_s)

    def stop(self) -> None:
        self._stop.set()
