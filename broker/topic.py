"""A topic served by this broker: its producers, subscriptions, storage and publish path.

Reliable topics append to their `ReliableTopicStorage` (WAL, uploader, tiered reader);
non-reliable ones only fan messages out to connected consumers. A topic that is unloading or
deleted refuses everything with `TopicMovedError`, which danube-client answers by looking the
topic up again. Runs on the broker's event loop; storage calls that block go to threads.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any, Callable

from danube_core.message import StreamMessage
from danube_core.records import RELIABLE, Policies, ProducerRecord
from danube_core.topics import TopicName

from broker.client_errors import ConflictError, LimitExceededError, MessageTooLargeError, NotFoundError, TopicMovedError
from broker.config import SubscriptionConfig
from broker.cursors import SubscriptionCursor
from broker.consumers import ConsumerSession
from broker.dispatch import Subscription, check_subscription_type
from broker.durable_ack import FlushWaiter
from broker.load_report import TopicLoad

logger = logging.getLogger(__name__)

PRODUCER_SHARED, PRODUCER_EXCLUSIVE = 0, 1


def random_id() -> int:
    """A random u64, as Danube picks broker, producer and consumer ids."""
    return secrets.randbits(64)


class Topic:
    """One local topic. `storage` is None for NonReliable topics."""

    def __init__(self, name: TopicName, delivery: str, policies: Policies, storage: Any, *,
                 loop: asyncio.AbstractEventLoop, subscriptions: SubscriptionConfig, durable: bool,
                 cursor_factory: Callable[[str], SubscriptionCursor]) -> None:
        self.name = name
        self.delivery = delivery
        self.policies = policies
        self.storage = storage if delivery == RELIABLE else None
        self.producers: dict[int, ProducerRecord] = {}
        self.subscriptions: dict[str, Subscription] = {}
        self.active = True
        self.messages_in = 0
        self.bytes_in = 0
        self._loop = loop
        self._config = subscriptions
        self._cursor_factory = cursor_factory
        self._subscribe_lock = asyncio.Lock()
        self._flush_waiter = FlushWaiter(storage.wal, loop, str(name)) if self.storage is not None and durable else None

    @property
    def reliable(self) -> bool:
        return self.storage is not None

    def check_active(self) -> None:
        if not self.active:
            raise TopicMovedError(f"topic {self.name} is leaving this broker; look it up again")

    # ---- producers ------------------------------------------------------------------------

    def add_producer(self, producer_name: str, access_mode: int) -> tuple[ProducerRecord, bool]:
        """The producer named `producer_name` (reused, as Danube does) or a new one; True if new."""
        self.check_active()
        for record in self.producers.values():
            if record.producer_name == producer_name:
                return record, False
        limit = self.policies.max_producers_per_topic
        if limit and len(self.producers) >= limit:
            raise LimitExceededError(f"topic {self.name} has {len(self.producers)} producers; "
                                     f"max_producers_per_topic is {limit}")
        exclusive = [r for r in self.producers.values() if r.access_mode == PRODUCER_EXCLUSIVE]
        if exclusive or (access_mode == PRODUCER_EXCLUSIVE and self.producers):
            holder = (exclusive or list(self.producers.values()))[0].producer_name
            raise ConflictError(f"topic {self.name} has producer {holder!r}; an Exclusive producer "
                                "cannot share a topic")
        record = ProducerRecord(access_mode=access_mode, producer_id=random_id(), producer_name=producer_name,
                                status=True, topic_name=self.name.broker_name)
        self.producers[record.producer_id] = record
        return record, True

    async def publish(self, msg: StreamMessage) -> int | None:
        """Store (reliable) or fan out (non-reliable) `msg`; returns its offset if stored."""
        self.check_active()
        limit = self.policies.max_message_size
        if limit and len(msg.payload) > limit:
            raise MessageTooLargeError(f"message of {len(msg.payload)} bytes for {self.name} is larger than "
                                       f"the namespace's max_message_size of {limit} bytes; nothing was stored")
        if msg.msg_id.producer_id not in self.producers:
            raise NotFoundError(f"producer {msg.msg_id.producer_id} is not attached to topic {self.name}")
        self.messages_in += 1
        self.bytes_in += len(msg.payload)
        if self.storage is None:
            for subscription in list(self.subscriptions.values()):
                subscription.offer(msg)
            return None
        offset = self.storage.append(msg)
        if self._flush_waiter is not None:
            await self._flush_waiter.wait(offset)
        return offset

    # ---- subscriptions --------------------------------------------------------------------

    async def subscribe(self, consumer_name: str, subscription: str, sub_type: int) -> tuple[ConsumerSession, bool]:
        """Attach a consumer (reusing one with the same name); True if the consumer is new."""
        check_subscription_type(sub_type)
        self.check_active()
        async with self._subscribe_lock:
            self.check_active()
            sub = self.subscriptions.get(subscription)
            if sub is None:
                sub = await self._new_subscription(subscription, sub_type)
            elif sub.sub_type != sub_type:
                raise ConflictError(f"subscription {subscription!r} of {self.name} is of type {sub.sub_type}; "
                                    f"a consumer asked for type {sub_type}")
            existing = sub.consumer_named(consumer_name)
            if existing is not None:
                return existing, False
            self._check_consumer_limit()
            session = ConsumerSession(random_id(), consumer_name, subscription, self.name.broker_name)
            sub.add_consumer(session, self.policies.max_consumers_per_subscription)
            return session, True

    def _check_consumer_limit(self) -> None:
        limit = self.policies.max_consumers_per_topic
        count = sum(len(s.consumers) for s in self.subscriptions.values())
        if limit and count >= limit:
            raise LimitExceededError(f"topic {self.name} has {count} consumers; max_consumers_per_topic is {limit}")

    async def _new_subscription(self, name: str, sub_type: int) -> Subscription:
        limit = self.policies.max_subscriptions_per_topic
        if limit and len(self.subscriptions) >= limit:
            raise LimitExceededError(f"topic {self.name} has {len(self.subscriptions)} subscriptions; "
                                     f"max_subscriptions_per_topic is {limit}")
        if self.storage is None:
            sub = Subscription(self.name.broker_name, name, sub_type, loop=self._loop)
        else:
            cursor = self._cursor_factory(name)
            await asyncio.to_thread(cursor.load)
            sub = Subscription(self.name.broker_name, name, sub_type, loop=self._loop, cursor=cursor,
                               window=self._config.max_unacked_messages,
                               cursor_flush_s=self._config.cursor_flush_interval_seconds)
            resume = cursor.resume_offset()
            sub.start_feed(self.storage, resume if resume is not None else self.storage.next_offset)
        self.subscriptions[name] = sub
        return sub

    def subscription(self, name: str) -> Subscription:
        sub = self.subscriptions.get(name)
        if sub is None:
            raise NotFoundError(f"subscription {name!r} does not exist on topic {self.name}")
        return sub

    # ---- lifecycle ------------------------------------------------------------------------

    def consumers(self) -> list[ConsumerSession]:
        return [c for s in self.subscriptions.values() for c in s.consumers.values()]

    async def deactivate(self, flush_cursors: bool) -> None:
        """Refuse new work, stop delivering, flush cursors (not on delete), finish durable acks."""
        self.active = False
        for sub in self.subscriptions.values():
            sub.close()
        if flush_cursors:
            for sub in self.subscriptions.values():
                await asyncio.to_thread(sub.flush_cursor)
        if self._flush_waiter is not None:
            await asyncio.to_thread(self._flush_waiter.close)

    def load(self) -> TopicLoad:
        return TopicLoad(
            topic_name=self.name.broker_name, messages_in=self.messages_in, bytes_in=self.bytes_in,
            producer_count=len(self.producers), consumer_count=len(self.consumers()),
            subscription_count=len(self.subscriptions),
            backlog_messages=sum(s.backlog for s in self.subscriptions.values()),
        )
