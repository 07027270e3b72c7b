"""The leader's placement when an old owner does not seal: after its wait, the topic is
assigned anyway, and the old owner is named (as for a dead one) so the next owner recovers
what its WAL holds beyond the uploads instead of handing those offsets out again."""

from __future__ import annotations

from broker.leader import TopicAssigner
from danube_core.keys import (
    StorageKeys, assignment_key, delivery_key, namespace_topic_key, register_key, unassigned_key,
)
from danube_core.metadata_memory import MemoryMetadataStore
from danube_core.records import NULL_JSON, RELIABLE, SealedState, UnassignedMarker, dump_delivery
from danube_core.topics import TopicName
from tests.rig import eventually

KEYS = StorageKeys("/danube-data")
OLD, NEW = 7, 8


def _unload_asked(metadata: MemoryMetadataStore, topic: TopicName) -> None:
    for broker_id in (OLD, NEW):
        metadata.put(register_key(broker_id), b"{}")
    metadata.put(namespace_topic_key(topic), NULL_JSON)
    metadata.put(delivery_key(topic), dump_delivery(RELIABLE))
    metadata.put(unassigned_key(topic), UnassignedMarker(from_broker=OLD, reason="unload").to_json())


def _assigned_to_new(metadata: MemoryMetadataStore, topic: TopicName, seal_wait_s: float) -> None:
    """Run a leader's assigner until it has placed `topic` on the other broker."""
    assigner = TopicAssigner(metadata, KEYS, seal_wait_s=seal_wait_s)
    assigner.start()
    try:
        eventually(lambda: metadata.get(assignment_key(NEW, topic)) is not None, 10)
    finally:
        assigner.stop()


def test_an_old_owner_that_does_not_seal_is_named_for_its_wal_when_the_wait_ends():
    metadata = MemoryMetadataStore()
    topic = TopicName("default", "stuck")
    _unload_asked(metadata, topic)
    _assigned_to_new(metadata, topic, seal_wait_s=0.5)
    record = SealedState.from_json(metadata.get(KEYS.state_key(topic)), KEYS.state_key(topic))
    assert (record.broker_id, record.sealed) == (OLD, False)
    assert metadata.get(unassigned_key(topic)) is None


def test_a_seal_written_before_the_wait_ends_is_kept():
    metadata = MemoryMetadataStore()
    topic = TopicName("default", "sealed")
    _unload_asked(metadata, topic)
    sealed = SealedState(broker_id=OLD, last_committed_offset=41, sealed=True, timestamp=1)
    metadata.put(KEYS.state_key(topic), sealed.to_json())
    _assigned_to_new(metadata, topic, seal_wait_s=30)
    assert SealedState.from_json(metadata.get(KEYS.state_key(topic)), KEYS.state_key(topic)) == sealed
