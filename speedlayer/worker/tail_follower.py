"""The thread that keeps a dataset's tail current: read the pipeline's topics past the store's
end, split them as the pipeline does, append.

The reading and the split are the pipeline's own (`pipelines.tail_feed.TailFeed`, in a tail
process of its own: `speedlayer.protocol.tail_process`): the same connector reads, decoder and
expectation suite. This module only decides when to read and how
much: at most what the store has room for (`TailStore.room`), so a tail past its limit stops
advancing and says how far behind it is instead of dropping rows; from the store's end, so the
rows stay contiguous per partition whatever fails in between.

What it says when it cannot follow (the answer's `speedlayer.tail` metadata carries it, while
the epoch keeps answering):

* `lost: ...` the topic no longer has offsets between the epoch and the tail (retention); it is
  never skipped: the tail stays where it is until an epoch beyond the loss replaces it;
* `error: ...` the pipeline file, the topic (deleted, unreadable) or a schema the decode needs
  failed; retried with backoff, the text names what failed;
* `behind: ...` the store is full (`limit_rows`/`limit_bytes`), with the messages not read.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Mapping

from speedlayer.observability.metrics import TAIL_AGE, TAIL_ERRORS, TAIL_LAG, TAIL_ROWS
from speedlayer.tail_spec import TailSpec
from speedlayer.worker.tail_store import TailStore

logger = logging.getLogger(__name__)

# How long one look at the topic's head may wait for a new message (the tail process waits, looking
# every 10 ms at its cached head: `pipelines.tail_feed`). The worker once asked every 20 ms instead,
# a request and an answer over the pipe each time; it also bounds how long `stop()` takes.
POLL_INTERVAL_S = 0.25
RETRY_MAX_S = 5.0


def pipeline_feed(spec: TailSpec, dataset: str) -> Any:
    """The pipeline's reader for `spec`: a tail process (`python -m pipelines tail`) running the
    pipeline's own reads and split, so the worker never imports Spark (`protocol.tail_process`)."""
    from speedlayer.protocol.tail_process import TailProcessFeed

    return TailProcessFeed(spec.pipeline_config, dataset)


def capped(start: Mapping[str, int], latest: Mapping[str, int], room: int) -> dict[str, int]:
    """Ends to read to: `latest`, cut so that at most `room` messages are read in all (shared
    evenly between the partitions that have some, none left behind without a reason)."""
    lag = {t: max(latest[t] - start.get(t, latest[t]), 0) for t in latest}
    if sum(lag.values()) <= room:
        return dict(latest)
    ends = {t: start.get(t, latest[t]) for t in latest}
    left = room
    waiting = sorted((n, t) for t, n in lag.items() if n)
    for i, (n, topic) in enumerate(waiting):
        share = min(n, left // (len(waiting) - i))
        ends[topic] += share
        left -= share
    return ends


class TailFollower:
    """Follows `spec`'s pipeline into `store` on a daemon thread until `stop()`."""

    def __init__(self, dataset: str, spec: TailSpec, store: TailStore,
                 feed_factory: Callable[[TailSpec, str], Any] = pipeline_feed,
                 poll_interval_s: float = POLL_INTERVAL_S) -> None:
        self.dataset, self.spec, self.store = dataset, spec, store
        self._feed_factory = feed_factory
        self._poll_interval_s = poll_interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"tail-{dataset}", daemon=True)
        self._topics: list[str] = []

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        backoff = 0.1
        feed = None
        while not self._stop.is_set():
            try:
                if feed is None:
                    opened = self._feed_factory(self.spec, self.dataset)
                    try:
                        self._begin(opened)
                    except BaseException:
                        opened.close()
                        raise
                    feed = opened
                full = not self._step(feed)
                backoff = 0.1
                if full:
                    self._stop.wait(self._poll_interval_s)
            except Exception as exc:  # every failure is a state the answers show, then retried
                state = self._failure(exc)
                TAIL_ERRORS.labels(dataset=self.dataset, state=state.split(":", 1)[0]).inc()
                logger.warning("tail of %s: %s", self.dataset, state)
                self.store.mark(state)
                if feed is not None and not getattr(feed, "alive", True):
                    feed.close()  # its process died: a new one is started (the store keeps its end)
                    feed = None
                self._stop.wait(backoff)
                backoff = min(backoff * 2, RETRY_MAX_S)
            finally:
                age = self.store.age_ms()
                if age >= 0:  # it grows while the tail cannot read (the alert rule's signal)
                    TAIL_AGE.labels(dataset=self.dataset).set(age / 1000)
        if feed is not None:
            feed.close()

    def _begin(self, feed: Any) -> None:
        """Partitions the epoch holds nothing of start where the pipeline starts: their earliest offset."""
        topics = feed.topics()
        ends = self.store.ends
        new = [t for t in topics if t not in ends]
        if new:
            earliest = feed.earliest(new)
            self.store.append(_empty(), {t: earliest[t] for t in new}, {t: earliest[t] for t in new})
        logger.info("tail of %s follows %s from %s", self.dataset, topics, self.store.ends)
        self._topics = topics

    def _step(self, feed: Any) -> bool:
        """One look at the head (waiting up to the poll interval for a new message) and the read
        it allows; False when the store is full (wait before looking again)."""
        ends = self.store.ends
        latest = feed.latest(self._topics, ends, self._poll_interval_s)
        lag = sum(max(latest[t] - ends.get(t, latest[t]), 0) for t in latest)
        rows, size = self.store.held
        TAIL_LAG.labels(dataset=self.dataset).set(lag)
        TAIL_ROWS.labels(dataset=self.dataset).set(rows)
        if lag == 0:
            self.store.mark("following", caught_up=True)
            return True
        room = self.store.room()
        if room == 0:
            self.store.mark(f"behind: the tail holds {rows} rows, {size} bytes (limit_rows {self.spec.limit_rows}, "
                            f"limit_bytes {self.spec.limit_bytes or 'none'}); {lag} messages on the topic not read")
            return False
        target = capped(ends, latest, room)
        batch = feed.read(ends, target)
        self.store.append(batch.rows, batch.first, batch.ends, state="following", caught_up=target == latest)
        return True

    @staticmethod
    def _failure(exc: Exception) -> str:
        from danube_core.errors import DataLossError

        if isinstance(exc, DataLossError):
            return f"lost: {exc}"
        return f"error: {type(exc).__name__}: {exc}"


def _empty() -> Any:
    import pyarrow as pa

    return pa.table({})
