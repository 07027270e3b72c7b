"""Subscription dispatch without servers: cursor over out-of-order acks, redelivery, types."""

from __future__ import annotations

import asyncio
import threading

import pytest

from broker.client_errors import ConflictError, InvalidRequestError
from broker.consumers import ConsumerSession
from broker.dispatch import EXCLUSIVE, SHARED, Subscription
from danube_core.message import MessageID, StreamMessage

pytestmark = pytest.mark.unit


class FakeCursor:
    def __init__(self) -> None:
        self.acked: list[int] = []

    def record(self, offset: int) -> bool:
        if not self.acked or offset > self.acked[-1]:
            self.acked.append(offset)
        return False  # no etcd behind this cursor: a flush is never due

    def flush(self) -> None:
        pass


class FakeStorage:
    """A reader over fixed messages that then waits, like a following TieredReader."""

    def __init__(self, offsets: list[int]) -> None:
        self.offsets = offsets

    def reader(self, from_offset: int, *, follow: bool, stop_event: threading.Event):
        for offset in self.offsets:
            if offset >= from_offset:
                yield StreamMessage(offset, MessageID(1, "/ns/t", "", offset), b"m%d" % offset, 0, "p")
        stop_event.wait()


async def _collect(stream, count: int, ack=None) -> list[int]:
    """The offsets of the first `count` messages; `ack` (if given) acknowledges each one, so
    stopping early (which detaches the stream) does not hand them to another consumer."""
    got = []
    async for msg in stream:
        got.append(msg.msg_id.topic_offset)
        if ack is not None:
            ack(msg.msg_id.topic_offset)
        if len(got) == count:
            break
    return got


def _subscription(sub_type: int, offsets: list[int], start: int = 0) -> tuple[Subscription, FakeCursor]:
    cursor = FakeCursor()
    sub = Subscription("/ns/t", "s", sub_type, loop=asyncio.get_running_loop(), cursor=cursor, cursor_flush_s=60)
    sub.start_feed(FakeStorage(offsets), start)
    return sub, cursor


def test_cursor_advances_only_over_acked_prefix_and_unacked_are_redelivered():
    async def scenario() -> None:
        sub, cursor = _subscription(EXCLUSIVE, [5, 6, 7, 8], start=5)
        session = ConsumerSession(1, "c", "s", "/ns/t")
        sub.add_consumer(session, 0)
        first = await _collect(session.stream(sub.on_attach, sub.on_detach), 4)
        assert first == [5, 6, 7, 8]
        for offset in (7, 5):
            sub.ack(offset)
        assert cursor.acked == [5]  # 6 is still unacked, so 7 cannot count yet
        again = await _collect(session.stream(sub.on_attach, sub.on_detach), 2)
        assert again == [6, 8]  # reconnect: unacked ones again, in offset order
        sub.ack(6)
        sub.ack(8)
        assert cursor.acked == [5, 7, 8]
        sub.close()

    asyncio.run(scenario())


def test_shared_subscription_alternates_between_connected_consumers():
    async def scenario() -> None:
        cursor = FakeCursor()
        sub = Subscription("/ns/t", "s", SHARED, loop=asyncio.get_running_loop(), cursor=cursor, cursor_flush_s=60)
        sessions = [ConsumerSession(i, f"c{i}", "s", "/ns/t") for i in range(2)]
        for session in sessions:
            sub.add_consumer(session, 0)
        # each acks what it gets: the first to finish would otherwise hand its unacked messages
        # to the other on detaching (a scheduling race this test once lost)
        collecting = [asyncio.create_task(_collect(s.stream(sub.on_attach, sub.on_detach), 5, sub.ack))
                      for s in sessions]
        await asyncio.sleep(0)  # both streams attached before the first message is read
        sub.start_feed(FakeStorage(list(range(10))), 0)
        results = await asyncio.wait_for(asyncio.gather(*collecting), 10)
        assert results == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]
        sub.close()

    asyncio.run(scenario())


def test_exclusive_subscription_refuses_a_second_consumer_and_bad_types_are_refused():
    async def scenario() -> None:
        sub, _ = _subscription(EXCLUSIVE, [])
        sub.add_consumer(ConsumerSession(1, "first", "s", "/ns/t"), 0)
        with pytest.raises(ConflictError, match="Exclusive"):
            sub.add_consumer(ConsumerSession(2, "second", "s", "/ns/t"), 0)
        with pytest.raises(InvalidRequestError, match="subscription type 3"):
            Subscription("/ns/t", "k", 3, loop=asyncio.get_running_loop())
        sub.close()

    asyncio.run(scenario())
