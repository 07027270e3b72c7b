"""The broker's client API behind the gRPC layer, and the topics this broker serves.

`BrokerService` answers what the gRPC services ask (create producer, send, subscribe, stream,
ack, lookup, partitions, health) and is the `AssignmentListener` of `ClusterMembership`:
assignments load topics here, releases unload or delete them. Everything runs on one asyncio
event loop; cluster callbacks arrive on a membership thread and are run on the loop. A topic's
`/topics` keys are in the lookup cache while it is served here (`ServedTopicKeys`): covered
before it loads, so loading, subscribing (cursors) and producer checks read no etcd, and dropped
once it has left.

Ids of producers and consumers whose topic left this broker are remembered (a bounded
number), so their next request gets `TopicMovedError` (UNAVAILABLE: danube-client looks the
topic up again) instead of NOT_FOUND (reported to the user), and the consumer's health check
answers CLOSE, which ends its stream and makes the client subscribe at the new owner.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

from danube_core.errors import DanubeError, InvalidTopicNameError
from danube_core.message import StreamMessage
from danube_core.records import NON_RELIABLE, RELIABLE, SubscriptionRecord
from danube_core.topics import TopicName

from broker.client_errors import (
    AlreadyExistsError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    TopicMovedError,
)
from broker.config import BrokerConfig
from broker.consumers import ConsumerSession
from broker.cursors import SubscriptionCursor
from broker.load_report import TopicLoad
from broker.lookup_cache import ServedTopicKeys
from broker.topic import Topic
from broker.topics_registry import TopicRegistry

logger = logging.getLogger(__name__)

DISPATCH_STRATEGIES = {0: NON_RELIABLE, 1: RELIABLE}
MOVED_IDS_REMEMBERED = 100_000
STREAM_CLOSE_GRACE_S = 12.0  # danube-client health-checks every 5 s; end streams it missed
DELIVERY_WAIT_TRIES, DELIVERY_WAIT_S = 3, 0.5  # as the broker waits for /topics{T}/delivery (§6.3)
LOOKUP_POLL_S = 0.05


def parse_topic(name: str) -> TopicName:
    """InvalidRequestError (INVALID_ARGUMENT) for a name not of the form /namespace/topic."""
    try:
        return TopicName.parse(name)
    except InvalidTopicNameError as exc:
        raise InvalidRequestError(str(exc)) from exc


@dataclass(frozen=True)
class Lookup:
    """A TopicLookup answer: `connect` (served here) or `redirect` to another broker."""

    connect: bool
    broker_url: str
    connect_url: str


# A broker stops taking messages this long before its registration lease may expire: the
# leader fails its topics over when etcd deletes the registration, and the next owner hands
# out offsets from what was uploaded and what this broker's WAL held by then. A message taken
# is acknowledged only while the lease cannot have expired yet (margin 0): its frame is then
# on disk before the next owner reads this WAL. The margin between the two is the time a
# frame has to reach the disk; one that takes longer is refused after it was stored, and the
# client's retry stores it twice (a duplicate, never a loss).
TAKE_MARGIN_S = 1.5

class BrokerService:
    """Local topics, producers and consumers of one broker process."""

    def __init__(self, config: BrokerConfig, registry: TopicRegistry, engine: Any, broker_id: int,
                 loop: asyncio.AbstractEventLoop, *, served_keys: ServedTopicKeys | None = None) -> None:
        self.config = config
        self.registry = registry
        self.served_keys = served_keys  # None: the registry's store holds (or reads) every topic's keys
        self.engine = engine
        self.broker_id = broker_id
        self._loop = loop
        self.topics: dict[TopicName, Topic] = {}
        self._producers: dict[int, Topic] = {}
        self._consumers: dict[int, tuple[Topic, ConsumerSession]] = {}
        self._moved_producers: collections.OrderedDict[int, str] = collections.OrderedDict()
        self._moved_consumers: collections.OrderedDict[int, ConsumerSession] = collections.OrderedDict()
        # Messages are taken only while etcd surely holds this broker's registration (the
        # membership's `registration_held`, set once it has joined) and not between a lapse
        # and the check of which topics are still assigned here (`on_registration_renewed`).
        self.registration_held: Callable[[float], bool] = lambda margin_s: True
        self._lapsed = False

    # ---- producers --------------------------------------------------------------------------

    async def create_producer(self, topic_name: str, producer_name: str, access_mode: int, dispatch: int,
                              schema_subject: str | None = None) -> int:
        """A producer id on the served topic; a missing topic is created (auto-create), recording
        the producer's schema subject as Danube does (`/topics{T}/schema_subject`, §6.1)."""
        name = parse_topic(topic_name)
        if not producer_name:
            raise InvalidRequestError(f"producer for {topic_name} has an empty producer_name")
        if dispatch not in DISPATCH_STRATEGIES:
            raise InvalidRequestError(f"dispatch_strategy {dispatch} is unknown; expected 0 NonReliable or 1 Reliable")
        topic = await self._serving_topic(name, DISPATCH_STRATEGIES[dispatch], schema_subject)
        record, created = topic.add_producer(producer_name, access_mode)
        if created:
            self._producers[record.producer_id] = topic
            await asyncio.to_thread(self.registry.put_producer, record)
            logger.info("producer %s (%d) created on %s", producer_name, record.producer_id, name)
        return record.producer_id

    async def send(self, msg: StreamMessage) -> int | None:
        producer_id = msg.msg_id.producer_id
        topic = self._producers.get(producer_id)
        if topic is None:
            raise await self._unknown_producer(producer_id, msg.msg_id.topic_name)
        if topic.name.broker_name != msg.msg_id.topic_name:
            raise InvalidRequestError(f"producer {producer_id} is attached to {topic.name}, "
                                      f"not to msg_id.topic_name {msg.msg_id.topic_name!r}")
        self._check_registration(topic.name, TAKE_MARGIN_S)
        offset = await topic.publish(msg)
        # Acknowledged only if the registration still surely held once the frame was on disk:
        # the topic's next owner (after a failover) continues after what this WAL held then.
        self._check_registration(topic.name, 0.0)
        return offset

    def _check_registration(self, name: TopicName, margin_s: float) -> None:
        if self._lapsed or not self.registration_held(margin_s):
            raise TopicMovedError(f"broker {self.broker_id} takes no message for {name}: etcd may no longer hold "
                                  "its registration, so the topic may be moving; look it up again")

    def on_registration_lapsed(self) -> None:
        """Membership (keep-alive thread): take no message until `on_registration_renewed`."""
        self._lapsed = True
        logger.error("broker %d takes no message until it is registered again", self.broker_id)

    def on_registration_renewed(self, assigned: set[TopicName]) -> None:
        """Membership thread: stop the topics failed over meanwhile, then take messages again."""
        asyncio.run_coroutine_threadsafe(self._keep_only(assigned), self._loop).result()

    async def _keep_only(self, assigned: set[TopicName]) -> None:
        for name, topic in list(self.topics.items()):
            if name in assigned:
                continue
            # Not sealed: the leader named this broker for its next owner, which uploads what
            # this WAL holds beyond the descriptors (the files stay) and continues after it.
            await self._deactivate(topic, flush_cursors=True)
            try:
                if topic.reliable:
                    await asyncio.to_thread(self.engine.close_topic, name)
            finally:
                self.topics.pop(name, None)
                await self._drop_keys(name)
            logger.warning("broker %d stopped %s, failed over while its registration lapsed (not sealed: "
                           "its next owner recovers this broker's WAL)", self.broker_id, name)
        self._lapsed = False
        logger.info("broker %d registered again; it takes messages for its %d topic(s)", self.broker_id,
                    len(self.topics))

    def on_unload_asked(self, topic: TopicName) -> None:
        """Membership thread: the unload of `topic` was asked while this broker was down."""
        asyncio.run_coroutine_threadsafe(self._unload_asked(topic), self._loop).result()

    async def _unload_asked(self, name: TopicName) -> None:
        if name in self.topics:
            await self._release(name, unload=True)
        elif await asyncio.to_thread(self.registry.delivery, name) == RELIABLE:
            # Its WAL may hold acknowledged frames beyond the uploaded ones: sealed, so the next
            # owner continues after them.
            await asyncio.to_thread(self.engine.seal_local_wal, name)

    async def _unknown_producer(self, producer_id: int, topic_name: str) -> Exception:
        """TopicMovedError if the producer exists elsewhere or existed before (its topic moved,
        or a previous owner crashed: its etcd record is left), so the client creates it again;
        NotFoundError for an id nobody issued."""
        name = parse_topic(topic_name)
        if producer_id in self._moved_producers:
            return TopicMovedError(f"topic {self._moved_producers[producer_id]} of producer {producer_id} "
                                   "moved to another broker; look it up again")
        topic = self.topics.get(name)
        if topic is None or not topic.active:
            return TopicMovedError(f"topic {topic_name} is not served by this broker; look it up again")
        if await asyncio.to_thread(self.registry.producer_exists, name, producer_id):
            return TopicMovedError(f"producer {producer_id} of {topic_name} was created on an earlier owner of "
                                   "the topic; create it again")
        return NotFoundError(f"producer {producer_id} does not exist on topic {topic_name}; create it first")

    def producer_healthy(self, producer_id: int) -> bool:
        return producer_id in self._producers

    # ---- consumers --------------------------------------------------------------------------

    async def subscribe(self, topic_name: str, consumer_name: str, subscription: str, sub_type: int) -> int:
        name = parse_topic(topic_name)
        if not consumer_name or not subscription:
            raise InvalidRequestError(f"consumer_name and subscription must not be empty (topic {topic_name})")
        topic = await self._serving_topic(name, None)
        session, created = await topic.subscribe(consumer_name, subscription, sub_type)
        self._consumers[session.consumer_id] = (topic, session)
        if created:
            record = SubscriptionRecord(consumer_id=None, consumer_name=consumer_name,
                                        subscription_name=subscription, subscription_type=sub_type)
            await asyncio.to_thread(self.registry.put_subscription, name, record)
            logger.info("consumer %s (%d) subscribed to %s as %s", consumer_name, session.consumer_id, name, subscription)
        return session.consumer_id

    def stream(self, consumer_id: int) -> AsyncIterator[StreamMessage]:
        entry = self._consumers.get(consumer_id)
        if entry is None:
            if consumer_id in self._moved_consumers:
                raise TopicMovedError(f"the topic of consumer {consumer_id} moved to another broker; subscribe again")
            raise NotFoundError(f"consumer {consumer_id} does not exist; subscribe first")
        topic, session = entry
        topic.check_active()
        sub = topic.subscription(session.subscription_name)
        return session.stream(sub.on_attach, sub.on_detach)

    async def ack(self, topic_name: str, subscription: str, offset: int) -> None:
        self._subscription(topic_name, subscription).ack(offset)

    async def nack(self, topic_name: str, subscription: str, offset: int, delay_ms: int) -> None:
        self._subscription(topic_name, subscription).nack(offset, delay_ms)

    def _subscription(self, topic_name: str, subscription: str):
        name = parse_topic(topic_name)
        topic = self.topics.get(name)
        if topic is None or not topic.active:
            raise TopicMovedError(f"topic {topic_name} is not served by this broker; look it up again")
        return topic.subscription(subscription)

    def consumer_healthy(self, consumer_id: int) -> bool:
        """False means CLOSE; a consumer of a topic that left ends its stream right after."""
        if consumer_id in self._consumers:
            return True
        session = self._moved_consumers.get(consumer_id)
        if session is not None:
            self._loop.call_later(0.05, session.end_stream)
        return False

    # ---- discovery --------------------------------------------------------------------------

    async def lookup(self, topic_name: str) -> Lookup:
        """Connect if served here, Redirect to the owner; waits while a topic is being assigned."""
        name = parse_topic(topic_name)
        deadline = time.monotonic() + self.config.coordination.lookup_wait_seconds
        own = self.config.listener
        while True:
            topic = self.topics.get(name)
            if topic is not None and topic.active:
                return Lookup(True, own.broker_url, own.connect_url)
            owner = await asyncio.to_thread(self.registry.owner, name)
            if owner is not None and owner != self.broker_id:
                registration = await asyncio.to_thread(self.registry.registration, owner)
                if registration is not None:
                    return Lookup(False, registration.broker_url, registration.connect_url)
            if owner is None and not await asyncio.to_thread(self.registry.exists, name):
                raise NotFoundError(f"topic {topic_name} does not exist")
            if time.monotonic() >= deadline:
                raise TopicMovedError(f"topic {topic_name} has no serving broker yet; retry the lookup")
            await asyncio.sleep(LOOKUP_POLL_S)

    async def partitions(self, topic_name: str) -> list[str]:
        name = parse_topic(topic_name)
        found = await asyncio.to_thread(self.registry.partitions, name)
        return [topic.broker_name for topic in found]

    # ---- topics served here -------------------------------------------------------------------

    async def _serving_topic(self, name: TopicName, delivery: str | None, schema_subject: str | None = None) -> Topic:
        """The local topic; else TopicMovedError (exists elsewhere / just created), NotFoundError,
        or the registry's ConflictError when the name clashes with a partitioned topic."""
        topic = self.topics.get(name)
        if topic is not None and topic.active:
            if delivery is not None and delivery != topic.delivery:
                raise ConflictError(f"topic {name} is {topic.delivery}; the producer asked for {delivery}")
            return topic
        if await asyncio.to_thread(self.registry.exists, name):
            raise TopicMovedError(f"topic {name} is served by another broker (or being assigned); look it up again")
        if delivery is None or not self.config.auto_create_topics:
            raise NotFoundError(f"topic {name} does not exist")
        try:
            await asyncio.to_thread(self.registry.create, name, delivery, schema_subject)
        except AlreadyExistsError:
            pass  # created concurrently by another producer (a clash with partitions is a ConflictError)
        raise TopicMovedError(f"topic {name} was created; look it up again to find its broker")

    def on_assigned(self, topic: TopicName) -> None:
        """Membership thread: load `topic` here (blocks until it is served)."""
        asyncio.run_coroutine_threadsafe(self._load(topic), self._loop).result()

    def on_released(self, topic: TopicName, unload: bool) -> None:
        """Membership thread: unload (seal, hand over) or delete `topic`."""
        asyncio.run_coroutine_threadsafe(self._release(topic, unload), self._loop).result()

    def topic_loads(self) -> list[TopicLoad]:
        return [topic.load() for topic in list(self.topics.values())]

    async def _load(self, name: TopicName) -> None:
        existing = self.topics.get(name)
        if existing is not None and existing.active:
            return
        await self._hold_keys(name)
        loaded = False
        try:
            delivery = await self._wait_for_delivery(name)
            if delivery is None:
                logger.error("topic %s assigned to broker %d has no delivery key; not loaded", name, self.broker_id)
                return
            policies = await asyncio.to_thread(self.registry.namespaces.topic_policies, name)
            storage = await asyncio.to_thread(self.engine.load_topic, name) if delivery == RELIABLE else None
            self.topics[name] = Topic(name, delivery, policies, storage, loop=self._loop,
                                      subscriptions=self.config.subscriptions, durable=self.config.wal.durable,
                                      cursor_factory=functools.partial(self._cursor, name))
            loaded = True
        finally:
            if not loaded:
                await self._drop_keys(name)
        logger.info("broker %d serves %s (%s)", self.broker_id, name, delivery)

    async def _hold_keys(self, name: TopicName) -> None:
        """Cache `name`'s `/topics` keys while it is served here. If etcd cannot be listed the
        topic loads anyway: its reads then go to etcd, as every read the cache does not hold."""
        if self.served_keys is None:
            return
        try:
            await asyncio.to_thread(self.served_keys.serve, name)
        except DanubeError as exc:
            logger.warning("cannot cache the keys of %s (%s); its metadata reads go to etcd", name, exc)

    async def _drop_keys(self, name: TopicName) -> None:
        if self.served_keys is not None:
            await asyncio.to_thread(self.served_keys.release, name)

    def _cursor(self, topic: TopicName, subscription: str) -> SubscriptionCursor:
        cfg = self.config.subscriptions
        return SubscriptionCursor(self.registry.metadata, topic, subscription,
                                  flush_every_acks=cfg.cursor_flush_every_acks,
                                  flush_interval_s=cfg.cursor_flush_interval_seconds)

    async def _wait_for_delivery(self, name: TopicName) -> str | None:
        for attempt in range(DELIVERY_WAIT_TRIES):
            delivery = await asyncio.to_thread(self.registry.delivery, name)
            if delivery is not None or attempt == DELIVERY_WAIT_TRIES - 1:
                return delivery
            await asyncio.sleep(DELIVERY_WAIT_S)
        return None

    async def _release(self, name: TopicName, unload: bool) -> None:
        topic = self.topics.get(name)
        if topic is None:
            if not unload:
                await asyncio.to_thread(self.engine.delete_topic, name)
            return
        await self._deactivate(topic, flush_cursors=unload)
        try:
            if topic.reliable:
                call = self.engine.unload_topic if unload else self.engine.delete_topic
                await asyncio.to_thread(call, name)
            if unload:
                await asyncio.to_thread(self.registry.delete_producers, name)
            if unload and not topic.reliable:
                # As the broker does: a non-reliable subscription has no state worth keeping,
                # its consumers subscribe again on the next owner.
                await asyncio.to_thread(self.registry.delete_subscriptions, name)
        finally:
            self.topics.pop(name, None)
            await self._drop_keys(name)
        logger.info("broker %d %s %s", self.broker_id, "unloaded" if unload else "deleted", name)

    async def _deactivate(self, topic: Topic, flush_cursors: bool) -> None:
        """Stop serving: remember its client ids as moved and end its consumers' streams soon."""
        await topic.deactivate(flush_cursors)
        for producer_id in list(topic.producers):
            self._producers.pop(producer_id, None)
            self._remember(self._moved_producers, producer_id, topic.name.broker_name)
        for session in topic.consumers():
            self._consumers.pop(session.consumer_id, None)
            self._remember(self._moved_consumers, session.consumer_id, session)
            self._loop.call_later(STREAM_CLOSE_GRACE_S, session.end_stream)

    @staticmethod
    def _remember(table: collections.OrderedDict, key: int, value: Any) -> None:
        table[key] = value
        while len(table) > MOVED_IDS_REMEMBERED:
            table.popitem(last=False)

    async def shutdown(self) -> None:
        """Hand every topic over (seal reliable ones) before the registration ends."""
        for name, topic in list(self.topics.items()):
            await self._deactivate(topic, flush_cursors=True)
            if topic.reliable:
                try:
                    await asyncio.to_thread(self.engine.unload_topic, name)
                except Exception:  # keep the local WAL: the next owner recovers from it
                    logger.exception("unloading %s at shutdown failed; closing it unsealed", name)
            self.topics.pop(name, None)
            await self._drop_keys(name)
        await asyncio.to_thread(self.engine.close)
