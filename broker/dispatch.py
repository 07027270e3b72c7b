"""Subscriptions: which consumer gets which message, acks, redelivery and the cursor (§5.3).

Types (proto `SubscriptionType`): 0 Exclusive (one consumer), 1 Shared (round-robin over
every consumer with an open stream), 2 Failover (many consumers, the first connected one gets
everything; the next takes over when its stream ends).

Reliable topics: a feed thread reads the topic's storage from the start offset (cursor + 1,
or the head for a new subscription: "Latest") and hands messages to the event loop. Up to
`window` messages may be unacked at once (Danube keeps one in flight; a window gives the same
guarantees at a useful speed). Unacked messages are redelivered when their consumer's stream
ends or is replaced (at-least-once), before newer ones, so an Exclusive consumer still sees
offsets in order. Acks may arrive in any order; the cursor is the last offset below which
everything is acked, written through `SubscriptionCursor` (batched, flushed on unload).

Non-reliable topics: messages are handed to a connected consumer as they are published and
forgotten; nothing is stored, acks are accepted and ignored.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import threading
from typing import Any

from danube_core.message import StreamMessage

from broker.client_errors import ConflictError, InvalidRequestError, LimitExceededError
from broker.consumers import ConsumerSession

logger = logging.getLogger(__name__)

EXCLUSIVE, SHARED, FAILOVER = 0, 1, 2
SUBSCRIPTION_TYPES = {EXCLUSIVE: "Exclusive", SHARED: "Shared", FAILOVER: "Failover"}
ATTACH_GRACE_S = 10.0  # a new consumer holds an Exclusive subscription this long before streaming
NON_RELIABLE_QUEUE_LIMIT = 10_000
FEED_RETRY_S = 1.0


def check_subscription_type(sub_type: int) -> None:
    if sub_type not in SUBSCRIPTION_TYPES:
        accepted = ", ".join(f"{k} {v}" for k, v in SUBSCRIPTION_TYPES.items())
        raise InvalidRequestError(f"subscription type {sub_type} is not supported; expected {accepted}")


class _Feed:
    """Thread reading a reliable topic into the loop, never more than `window` unacked."""

    def __init__(self, storage: Any, start: int, window: int, loop: asyncio.AbstractEventLoop, subscription: "Subscription") -> None:
        self._storage, self._start, self._loop, self._sub = storage, start, loop, subscription
        self._permits = threading.Semaphore(window)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"feed-{subscription.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def release(self) -> None:
        self._permits.release()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        try:
            for msg in self._storage.reader(self._start, follow=True, stop_event=self._stop):
                while not self._permits.acquire(timeout=0.2):
                    if self._stop.is_set():
                        return
                if self._stop.is_set():
                    return
                self._loop.call_soon_threadsafe(self._sub._on_read, msg)
        except Exception as exc:  # a reader failure must not end the subscription silently
            if not self._stop.is_set():
                logger.exception("reading %s for subscription %s failed", self._sub.topic_name, self._sub.name)
                self._loop.call_soon_threadsafe(self._sub._on_feed_error, exc)


class Subscription:
    """One subscription of one topic on this broker. Runs on the event loop."""

    def __init__(self, topic_name: str, name: str, sub_type: int, *, loop: asyncio.AbstractEventLoop,
                 cursor: Any = None, window: int = 1000, cursor_flush_s: float = 5.0) -> None:
        check_subscription_type(sub_type)
        self.topic_name, self.name, self.sub_type = topic_name, name, sub_type
        self.reliable = cursor is not None
        self.consumers: dict[int, ConsumerSession] = {}
        self._loop, self._cursor, self._window = loop, cursor, window
        self._cursor_flush_s = cursor_flush_s
        self._flush_timer: asyncio.TimerHandle | None = None
        self._storage: Any = None
        self._feed: _Feed | None = None
        self._pending: dict[int, StreamMessage] = {}  # read, not acked
        self._outstanding: list[int] = []  # heap over pending offsets (lazy deletes)
        self._fresh: list[int] = []  # heap: read, never delivered
        self._redeliver: list[int] = []  # heap: delivered, taken back, to send again
        self._holder: dict[int, ConsumerSession] = {}
        self._read_high = -1
        self._start_offset = 0
        self._last_shared: int | None = None  # round-robin position of a Shared subscription
        self.closed = False

    # ---- consumers -----------------------------------------------------------------------

    def add_consumer(self, session: ConsumerSession, max_consumers: int) -> None:
        """Attach a new consumer; ConflictError if an Exclusive subscription is held by another."""
        if self.sub_type == EXCLUSIVE:
            holders = [c for c in self.consumers.values() if c.streaming or c.recently_created(ATTACH_GRACE_S)]
            if holders:
                raise ConflictError(
                    f"subscription {self.name!r} of {self.topic_name} is Exclusive and held by consumer "
                    f"{holders[0].consumer_name!r}; use another subscription or a Shared/Failover one"
                )
            for stale in list(self.consumers.values()):
                self.remove_consumer(stale)
        if max_consumers and len(self.consumers) >= max_consumers:
            raise LimitExceededError(
                f"subscription {self.name!r} of {self.topic_name} has {len(self.consumers)} consumers; "
                f"max_consumers_per_subscription is {max_consumers}"
            )
        self.consumers[session.consumer_id] = session

    def consumer_named(self, consumer_name: str) -> ConsumerSession | None:
        return next((c for c in self.consumers.values() if c.consumer_name == consumer_name), None)

    def remove_consumer(self, session: ConsumerSession) -> None:
        self.consumers.pop(session.consumer_id, None)
        session.end_stream()
        self._take_back(session)

    def on_attach(self, session: ConsumerSession) -> None:
        """A stream (re)attached: everything the consumer held unacked is sent again."""
        self._take_back(session)
        self._pump()

    def on_detach(self, session: ConsumerSession) -> None:
        self._take_back(session)
        self._pump()

    def _take_back(self, session: ConsumerSession) -> None:
        for offset in session.inflight:
            if self._holder.pop(offset, None) is session and offset in self._pending:
                heapq.heappush(self._redeliver, offset)
        session.inflight.clear()

    # ---- reliable feed, acks, cursor -----------------------------------------------------

    def start_feed(self, storage: Any, start_offset: int) -> None:
        """Start reading at `start_offset` (cursor + 1, or the head for a new subscription)."""
        self._storage = storage
        self._start_offset = start_offset
        self._read_high = start_offset - 1
        self._feed = _Feed(storage, start_offset, self._window, self._loop, self)
        self._feed.start()
        logger.info("subscription %s of %s reads from offset %d", self.name, self.topic_name, start_offset)

    def _on_read(self, msg: StreamMessage) -> None:
        if self.closed:
            return
        offset = msg.msg_id.topic_offset
        self._pending[offset] = msg
        heapq.heappush(self._outstanding, offset)
        heapq.heappush(self._fresh, offset)
        self._read_high = max(self._read_high, offset)
        self._pump()

    def _on_feed_error(self, error: Exception) -> None:
        if self.closed or self._storage is None:
            return
        restart_at = self._read_high + 1
        logger.warning("subscription %s of %s: restarting its reader at %d in %.1fs after: %s",
                       self.name, self.topic_name, restart_at, FEED_RETRY_S, error)
        self._loop.call_later(FEED_RETRY_S, self._restart_feed, restart_at)

    def _restart_feed(self, start: int) -> None:
        if not self.closed:
            self._feed = _Feed(self._storage, start, max(self._window - len(self._pending), 1), self._loop, self)
            self._feed.start()

    def ack(self, offset: int) -> None:
        """Acknowledge one offset; unknown or repeated acks are ignored (at-least-once)."""
        if not self.reliable or self._pending.pop(offset, None) is None:
            return
        holder = self._holder.pop(offset, None)
        if holder is not None:
            holder.inflight.discard(offset)
        if self._feed is not None:
            self._feed.release()
        while self._outstanding and self._outstanding[0] not in self._pending:
            heapq.heappop(self._outstanding)
        acked_through = self._outstanding[0] - 1 if self._outstanding else self._read_high
        if acked_through >= self._start_offset:
            # The etcd write (a blocking put) never runs on the event loop, where a stall ages
            # queued calls until gRPC drops them as CANCELLED.
            if self._cursor.record(acked_through):
                self._loop.run_in_executor(None, self._flush_cursor_now)
            if self._flush_timer is None:
                # The cursor writes only on acks; this makes sure the last ack of a burst lands too.
                self._flush_timer = self._loop.call_later(self._cursor_flush_s, self._flush_cursor)
        self._pump()

    def _flush_cursor_now(self) -> None:
        """Runs on an executor thread; the cursor is thread-safe and only moves forward."""
        if not self.closed:
            self._cursor.flush()

    def _flush_cursor(self) -> None:
        self._flush_timer = None
        self._loop.run_in_executor(None, self._flush_cursor_now)

    def nack(self, offset: int, delay_ms: int) -> None:
        """Send `offset` again after `delay_ms` (to any consumer, by the subscription's rules)."""
        holder = self._holder.pop(offset, None)
        if holder is None or offset not in self._pending:
            return
        holder.inflight.discard(offset)
        self._loop.call_later(delay_ms / 1000.0, self._requeue, offset)

    def _requeue(self, offset: int) -> None:
        if offset in self._pending and offset not in self._holder and not self.closed:
            heapq.heappush(self._redeliver, offset)
            self._pump()

    def _pump(self) -> None:
        """Deliver queued messages while a consumer can take them."""
        while not self.closed:
            queue = self._redeliver if self._redeliver else self._fresh
            if not queue:
                return
            target = self._pick()
            if target is None:
                return
            offset = heapq.heappop(queue)
            msg = self._pending.get(offset)
            if msg is None or offset in self._holder:
                continue
            self._holder[offset] = target
            target.inflight.add(offset)
            target.deliver(msg)

    def _pick(self) -> ConsumerSession | None:
        ready = [c for c in self.consumers.values() if c.streaming and not c.closing]
        if not ready:
            return None
        if self.sub_type != SHARED:
            return ready[0] if len(ready[0].inflight) < self._window else None
        ids = [c.consumer_id for c in ready]
        start = ids.index(self._last_shared) + 1 if self._last_shared in ids else 0
        for i in range(len(ready)):
            candidate = ready[(start + i) % len(ready)]
            if len(candidate.inflight) < self._window:
                self._last_shared = candidate.consumer_id
                return candidate
        return None

    # ---- non-reliable ----------------------------------------------------------------------

    def offer(self, msg: StreamMessage) -> None:
        """Non-reliable: hand `msg` to a connected consumer now, or drop it."""
        target = self._pick()
        if target is not None and target.queued() < NON_RELIABLE_QUEUE_LIMIT:
            target.deliver(msg)

    # ---- lifecycle and stats ----------------------------------------------------------------

    @property
    def backlog(self) -> int:
        return len(self._pending)

    @property
    def acked_offset(self) -> int | None:
        """The newest offset acknowledged through (inclusive; None: none yet, or not reliable),
        possibly ahead of the cursor in etcd: what the lag metric counts from."""
        return None if self._cursor is None else self._cursor.acked_offset

    def close(self) -> None:
        """Stop reading and delivering; consumers are told to look the topic up again.

        The cursor is not flushed here: an unload flushes it (`flush_cursor`), a delete must not.
        """
        self.closed = True
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        if self._feed is not None:
            self._feed.stop()
        for session in self.consumers.values():
            session.closing = True

    def flush_cursor(self) -> None:
        """Write the newest acked position now (blocking etcd put; call from a thread)."""
        if self._cursor is not None:
            self._cursor.flush()
