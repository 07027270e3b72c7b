"""The broker's Prometheus collector without servers: Danube's metric names read from the topics a
broker serves, and each subscription's lag from its cursor (the broker's own newer acks first)
and from what the data source recorded (bytes, publish-time seconds); no cursor, no lag."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from broker.config import SubscriptionConfig
from broker.cursors import SubscriptionCursor
from broker.dispatch import Subscription
from broker.metrics import BrokerCollector
from broker.topic import Topic
from danube_core.keys import cursor_key, subscription_key
from danube_core.metadata_memory import MemoryMetadataStore
from danube_core.records import NON_RELIABLE, RELIABLE, Policies, dump_cursor, dump_json
from danube_core.topics import TopicName

pytestmark = pytest.mark.unit

ORDERS = TopicName.parse("/default/orders-part-0")
EVENTS = TopicName.parse("/default/events")


@pytest.fixture
def broker():
    """A service of two topics: reliable orders-part-0 (head at offset 100) with three
    subscriptions, non-reliable events with none; its store as the lookup cache would hold it."""
    loop = asyncio.new_event_loop()
    store = MemoryMetadataStore()
    store.put(subscription_key(ORDERS, "pipeline"), dump_json({
        "consumer_id": None, "consumer_name": "danube-spark", "subscription_name": "pipeline",
        "subscription_type": 0, "lag": {"messages": 40, "bytes": 4096, "ms": 2500, "updated_at": 1}}))
    store.put(cursor_key(ORDERS, "pipeline"), dump_cursor(59))
    store.put(cursor_key(ORDERS, "live"), dump_cursor(50))  # the broker has acked further in memory
    store.put(subscription_key(ORDERS, "fresh"), dump_json({"consumer_id": None, "consumer_name": "c",
                                                            "subscription_name": "fresh", "subscription_type": 0}))
    topics = {}
    for name, delivery in ((ORDERS, RELIABLE), (EVENTS, NON_RELIABLE)):
        topics[name] = Topic(name, delivery, Policies(), SimpleNamespace(next_offset=100), loop=loop,
                             subscriptions=SubscriptionConfig(), durable=False, cursor_factory=lambda sub: None)
    cursor = SubscriptionCursor(store, ORDERS, "live")
    cursor.load()
    cursor.record(89)
    topics[ORDERS].subscriptions["live"] = Subscription(str(ORDERS), "live", 1, loop=loop, cursor=cursor)
    topics[ORDERS].messages_in, topics[ORDERS].bytes_in = 100, 12_800
    service = SimpleNamespace(topics=topics, registry=SimpleNamespace(metadata=store))
    leading = [False]
    registry = CollectorRegistry()
    registry.register(BrokerCollector(service, 7, lambda: leading[0]))
    yield registry, leading
    store.close()
    loop.close()


def test_served_topics_export_danube_names_labelled_by_broker_and_topic(broker):
    registry, leading = broker
    value = registry.get_sample_value
    assert value("danube_broker_topics_owned", {"broker": "7"}) == 2.0
    assert value("danube_leader_election_state", {"broker": "7"}) == 0.0
    leading[0] = True
    assert value("danube_leader_election_state", {"broker": "7"}) == 1.0
    orders = {"broker": "7", "topic": "/default/orders-part-0"}
    assert value("danube_topic_messages_in_total", orders) == 100.0
    assert value("danube_topic_bytes_in_total", orders) == 12_800.0
    assert value("danube_topic_active_subscriptions", orders) == 1.0
    assert value("danube_subscription_active_consumers", {**orders, "subscription": "live"}) == 0.0
    assert value("danube_topic_active_producers", {"broker": "7", "topic": "/default/events"}) == 0.0


def test_subscription_lag_from_cursors_and_the_data_sources_record(broker):
    registry, _ = broker
    value = registry.get_sample_value
    orders = {"broker": "7", "topic": "/default/orders-part-0"}
    pipeline, live = {**orders, "subscription": "pipeline"}, {**orders, "subscription": "live"}
    assert value("danube_subscription_lag_messages", pipeline) == 40.0  # 100 - (59 + 1)
    assert value("danube_subscription_lag_bytes", pipeline) == 4096.0
    assert value("danube_subscription_lag_seconds", pipeline) == 2.5
    assert value("danube_subscription_lag_messages", live) == 10.0  # acked through 89, etcd still says 50
    assert value("danube_subscription_lag_bytes", live) is None  # the broker measures messages only

    lagging = {tuple(sorted(s.labels.items())) for family in registry.collect() for s in family.samples
               if s.name == "danube_subscription_lag_messages"}
    assert lagging == {tuple(sorted(pipeline.items())), tuple(sorted(live.items()))}  # fresh: no cursor, no lag


def test_describing_reads_nothing_from_the_broker():
    class Untouchable:
        def __getattr__(self, name):
            raise AssertionError(f"describe() read service.{name}")

    collector = BrokerCollector(Untouchable(), 1, lambda: True)
    names = {family.name for family in collector.describe()}
    assert {"danube_subscription_lag_messages", "danube_topic_messages_in", "danube_broker_topics_owned"} <= names
