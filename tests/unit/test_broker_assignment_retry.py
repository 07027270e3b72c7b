"""A broker whose load of an assigned topic fails loads it again while the assignment stands
(`broker.cluster.ClusterMembership`), on an in-memory metadata store.

The soak's second find (issue 43): a partition moved to a broker just as its WAL disk was full;
the load failed once, was logged, and never tried again, so the partition stayed assigned to
that broker and served by nobody for the rest of the run."""

from __future__ import annotations

import threading
import time

from broker import cluster
from broker.cluster import ClusterMembership
from broker.config import CoordinationConfig
from danube_core.keys import assignment_key
from danube_core.metadata_memory import MemoryMetadataStore
from danube_core.records import NULL_JSON, BrokerRegistration
from danube_core.topics import TopicName

TOPIC = TopicName.parse("/default/retried")


class FlakyListener:
    """Fails the first `failures` loads of a topic (as a full disk does), then serves it."""

    def __init__(self, failures: int) -> None:
        self.failures, self.attempts, self.served = failures, 0, threading.Event()

    def on_assigned(self, topic: TopicName) -> None:
        self.attempts += 1
        if self.attempts <= self.failures:
            raise OSError(28, "No space left on device")
        self.served.set()

    def on_released(self, topic: TopicName, unload: bool) -> None:
        pass

    def topic_loads(self) -> list:
        return []


def membership(store: MemoryMetadataStore, broker_id: int = 7) -> ClusterMembership:
    registration = BrokerRegistration(admin_addr="a", broker_url="http://b", connect_url="http://b")
    return ClusterMembership(store, broker_id, registration, "c", CoordinationConfig(register_ttl_seconds=5))


def test_a_topic_that_failed_to_load_is_loaded_again_while_assigned(monkeypatch):
    monkeypatch.setattr(cluster, "LOAD_RETRY_FIRST_S", 0.05)
    store = MemoryMetadataStore()
    store.put(assignment_key(7, TOPIC), NULL_JSON)
    listener = FlakyListener(failures=2)
    member = membership(store)
    member.join(listener)
    try:
        assert listener.served.wait(10), f"not served after {listener.attempts} attempts"
        assert listener.attempts == 3
    finally:
        member.leave()


def test_a_failed_load_is_not_retried_once_the_topic_is_assigned_elsewhere(monkeypatch):
    monkeypatch.setattr(cluster, "LOAD_RETRY_FIRST_S", 0.2)
    store = MemoryMetadataStore()
    store.put(assignment_key(7, TOPIC), NULL_JSON)
    listener = FlakyListener(failures=1)
    member = membership(store)
    member.join(listener)
    try:
        deadline = time.monotonic() + 10
        while listener.attempts < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        store.delete(assignment_key(7, TOPIC))  # moved away before the retry
        time.sleep(1.0)
        assert listener.attempts == 1 and not listener.served.is_set()
    finally:
        member.leave()
