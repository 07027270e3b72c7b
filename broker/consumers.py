"""One consumer of a subscription and its ReceiveMessages stream.

A consumer id lives as long as its subscription on this broker; streams come and go (the
client reconnects, the broker ends one). At most one stream is attached: a new
ReceiveMessages for the same id takes over and the old stream ends. Everything here runs on
the broker's event loop.
"""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator, Callable

from danube_core.message import StreamMessage

_END = None  # sentinel put into a stream's queue to end it


class ConsumerSession:
    """A consumer: its identity, the reliable offsets it holds unacked, its current stream.

    `inflight` holds offsets delivered to it (queued or sent) and not yet acked; the
    subscription takes them back for redelivery when the stream ends or is replaced.
    `closing` is set when the topic leaves this broker: the health check then answers CLOSE,
    which is what makes danube-client look the topic up again.
    """

    def __init__(self, consumer_id: int, consumer_name: str, subscription_name: str, topic_name: str) -> None:
        self.consumer_id = consumer_id
        self.consumer_name = consumer_name
        self.subscription_name = subscription_name
        self.topic_name = topic_name
        self.created_at = time.monotonic()
        self.inflight: set[int] = set()
        self.closing = False
        self._queue: asyncio.Queue[StreamMessage | None] | None = None
        self._generation = 0

    @property
    def streaming(self) -> bool:
        return self._queue is not None

    def recently_created(self, grace_s: float) -> bool:
        return time.monotonic() - self.created_at < grace_s

    def queued(self) -> int:
        return self._queue.qsize() if self._queue is not None else 0

    def deliver(self, msg: StreamMessage) -> None:
        """Hand a message to the attached stream (the caller checked `streaming`)."""
        assert self._queue is not None, "deliver() without an attached stream"
        self._queue.put_nowait(msg)

    def end_stream(self) -> None:
        """End the attached stream (if any) after what it has already queued."""
        if self._queue is not None:
            self._queue.put_nowait(_END)

    async def stream(
        self,
        on_attach: Callable[["ConsumerSession"], None],
        on_detach: Callable[["ConsumerSession"], None],
    ) -> AsyncIterator[StreamMessage]:
        """Messages for one ReceiveMessages call, until it is replaced, ended or cancelled."""
        if self._queue is not None:
            self._queue.put_nowait(_END)  # take over from the previous stream
        self._generation += 1
        generation = self._generation
        queue: asyncio.Queue[StreamMessage | None] = asyncio.Queue()
        self._queue = queue
        on_attach(self)
        try:
            while True:
                item = await queue.get()
                if item is _END or generation != self._generation:
                    return
                yield item
        finally:
            if generation == self._generation:
                self._queue = None
                on_detach(self)
