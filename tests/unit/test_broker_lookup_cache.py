"""The broker's lookup cache and owner lookups (issue 25: costs grow with the work, not with
the cluster), on the in-memory store without servers.

The cache holds `/cluster/` and `/namespaces/` for the whole cluster (any broker answers a
lookup of any topic) and a topic's `/topics` keys only while this broker serves it; `owner`
reads one assignment key per broker instead of every assignment of the cluster.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Iterator

import pytest

from broker.config import parse_config
from broker.lookup_cache import ServedTopicKeys, open_lookup_cache
from broker.service import BrokerService
from broker.topics_registry import TopicRegistry, broker_ids
from danube_core.cached_store import CachedMetadataStore
from danube_core.keys import (
    assignment_key,
    broker_state_key,
    cursor_key,
    delivery_key,
    namespace_policy_key,
    namespace_topic_key,
    producer_key,
    register_key,
    subscription_key,
    topic_keys_prefix,
)
from danube_core.metadata import MetadataStore
from danube_core.metadata_memory import MemoryMetadataStore
from danube_core.records import (
    NON_RELIABLE,
    NULL_JSON,
    RELIABLE,
    BrokerRegistration,
    BrokerState,
    Policies,
    ProducerRecord,
    SubscriptionRecord,
    dump_cursor,
    dump_delivery,
)
from danube_core.topics import TopicName
from tests.rig import CountingStore

pytestmark = pytest.mark.unit

WAIT_S = 20.0
SELF, OTHER, DEAD = 7, 12, 3  # DEAD: a state key and assignments, no registration
PRODUCER_ID = 42
CURSOR = 99


def _put_cluster(store: MetadataStore, namespace: str, count: int, owners: dict[int, int]) -> list[TopicName]:
    """`count` topics of `namespace` with every key a served topic has; topic i is assigned to
    `owners.get(i, OTHER)`. Even topics are reliable."""
    store.put(namespace_policy_key(namespace), Policies().to_json())
    for broker_id in (SELF, OTHER):
        store.put(register_key(broker_id), BrokerRegistration("http://a", f"http://b{broker_id}", "c").to_json())
    for broker_id in (SELF, OTHER, DEAD):
        store.put(broker_state_key(broker_id), BrokerState("active", "boot").to_json())
    topics = [TopicName(namespace, f"t-{i:03d}") for i in range(count)]
    for i, topic in enumerate(topics):
        store.put(namespace_topic_key(topic), NULL_JSON)
        store.put(assignment_key(owners.get(i, OTHER), topic), NULL_JSON)
        store.put(delivery_key(topic), dump_delivery(RELIABLE if i % 2 == 0 else NON_RELIABLE))
        store.put(producer_key(topic, PRODUCER_ID),
                  ProducerRecord(0, PRODUCER_ID, "p", True, topic.broker_name).to_json())
        store.put(subscription_key(topic, "s"), SubscriptionRecord(None, "c", "s", 0).to_json())
        store.put(cursor_key(topic, "s"), dump_cursor(CURSOR))
    return topics


class WaitingStorage:
    """A reliable topic's storage with nothing stored: its readers wait until stopped."""

    next_offset = 0

    def reader(self, from_offset: int, *, follow: bool, stop_event: threading.Event) -> Iterator[Any]:
        stop_event.wait()
        return iter(())


class FakeEngine:
    def load_topic(self, topic: TopicName) -> WaitingStorage:
        return WaitingStorage()

    def unload_topic(self, topic: TopicName) -> None:
        return None

    def delete_topic(self, topic: TopicName) -> None:
        return None

    def close(self) -> None:
        return None


def _held_under(store: MetadataStore, topic: TopicName) -> int:
    return len(store.get_prefix(topic_keys_prefix(topic), keys_only=True))


def test_a_broker_caches_topics_keys_only_while_it_serves_them(unique_name):
    store = MemoryMetadataStore()
    namespace = unique_name("ns")
    topics = _put_cluster(store, namespace, 40, owners={0: SELF, 1: SELF})
    mine, elsewhere = topics[:2], topics[6]
    cache = open_lookup_cache(store, "test")
    etcd = CountingStore(store)  # the lookups' reads that reach etcd
    registry = TopicRegistry(CachedMetadataStore(etcd, cache))  # type: ignore[arg-type]
    served = ServedTopicKeys(cache)
    config = parse_config({"wal_cloud": {"wal": {"file_sync": {"durable": False}}}}, "test")

    def caught_up() -> None:
        cache.wait_for_revision(store.current_revision(), WAIT_S)

    async def scenario() -> None:
        service = BrokerService(config, registry, FakeEngine(), SELF, asyncio.get_running_loop(),
                                served_keys=served)
        cluster_wide = cache.keys_held
        assert not cache.covers("/topics/", "/topics0")
        for topic in mine:
            await service._load(topic)
        assert served.topics() == mine and all(service.topics[t].active for t in mine)
        assert cache.keys_held == cluster_wide + sum(_held_under(store, t) for t in mine)
        assert not cache.covers(topic_keys_prefix(elsewhere), topic_keys_prefix(elsewhere) + "~")

        before = etcd.reads  # a served topic's reads, and any topic's lookups, stay in the process
        assert registry.delivery(mine[0]) == RELIABLE and registry.producer_exists(mine[0], PRODUCER_ID)
        consumer = await service.subscribe(mine[0].broker_name, "c", "s", 0)
        cursor = service.topics[mine[0]].subscription("s")._cursor  # loaded from the cache at subscribe
        assert cursor.resume_offset() == CURSOR + 1
        assert registry.owner(elsewhere) == OTHER and registry.exists(elsewhere)
        assert registry.partitions(elsewhere) == [elsewhere]
        assert etcd.reads == before, etcd.calls
        assert registry.delivery(elsewhere) == RELIABLE and etcd.reads == before + 1  # not served: etcd

        await service._release(mine[0], unload=True)
        caught_up()
        assert served.topics() == [mine[1]] and service.consumer_healthy(consumer) is False
        assert cache.keys_held == cluster_wide + _held_under(store, mine[1])
        await service.shutdown()
        caught_up()
        assert served.topics() == [] and cache.keys_held == cluster_wide

    try:
        asyncio.run(scenario())
    finally:
        cache.close()


class RowCountingStore(CountingStore):
    """Also counts the keys its range reads return."""

    def __init__(self, store: MetadataStore) -> None:
        super().__init__(store)
        self.rows = 0

    def get_range(self, start_key: str, end_key: str, limit: int | None = None):
        self.calls["get_range"] = self.calls.get("get_range", 0) + 1
        found = self._store.get_range(start_key, end_key, limit)
        self.rows += len(found)
        return found


def test_owner_reads_one_key_per_broker_not_every_assignment(unique_name):
    store = MemoryMetadataStore()
    namespace = unique_name("ns")
    topics = _put_cluster(store, namespace, 300, owners={0: SELF, 1: DEAD})
    store.put(namespace_topic_key(TopicName(namespace, "unassigned")), NULL_JSON)
    counting = RowCountingStore(store)
    registry = TopicRegistry(counting)  # type: ignore[arg-type]
    brokers = 3
    cases = {topics[0]: SELF, topics[1]: DEAD, topics[299]: OTHER, TopicName(namespace, "unassigned"): None,
             TopicName(namespace, "nothing"): None}
    for topic, expected in cases.items():
        counting.calls.clear()
        counting.rows = 0
        assert registry.owner(topic) == expected, topic
        # One limit-1 range read per broker (and one finding none), at most one get per broker.
        assert counting.calls.get("get_range", 0) == brokers + 1 and counting.rows == brokers
        assert counting.calls.get("get", 0) <= brokers and "get_prefix" not in counting.calls
    assert registry.owners(list(cases)) == cases  # a listing: one range read per broker


def test_broker_ids_skips_each_brokers_keys_in_key_order():
    store = MemoryMetadataStore()
    for broker_id in (2, 12, 1, 10):
        store.put(broker_state_key(broker_id), b"{}")
        for i in range(5):
            store.put(assignment_key(broker_id, TopicName("ns", f"t{i}")), NULL_JSON)
    store.put("/cluster/brokers/1-not-a-broker/x", NULL_JSON)
    store.put("/cluster/brokers/loose", NULL_JSON)
    assert broker_ids(store) == [1, 10, 12, 2]
    assert broker_ids(MemoryMetadataStore()) == []
