"""Seed 003 with two broker processes (separate WAL dirs and ports, shared etcd and storage):
produce 0–21 on A, ack up to 13, `admin unload`, B takes the topic, the producer's client
reconnects and sends 22–27, the consumer's client reconnects and receives 14..27 exactly once
in order; its cursor ends at 27. After the unload A has deleted its producers' keys and kept,
as the real broker keeps them (§6.2), the delivery, subscription and cursor keys, its
registration's `wal_url`, and its local WAL files and checkpoints, readable."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from danube import ProducerOptions, SubType
from fsspec.implementations.local import LocalFileSystem

from broker.uploader import ReadOnlyWal
from danube_core.wal_files import read_segments
from danube_core.checkpoints import UploaderCheckpoint, WalCheckpoint, read_checkpoint
from danube_core.records import BrokerRegistration
from tests.integration.broker_process import BrokerProcess, reliable_producer, run_admin
from tests.rig import eventually
from tests.unit.test_load_report import assert_shape_of_a_golden_load

pytestmark = pytest.mark.integration


def _owner(etcd_endpoint: str, namespace: str, topic: str) -> int | None:
    rows = run_admin(etcd_endpoint, "topics", "list", namespace)
    return next((row["owner"] for row in rows if row["topic"] == topic), None)


def _cursor(etcd_endpoint: str, topic: str, subscription: str) -> int | None:
    rows = run_admin(etcd_endpoint, "topics", "subscriptions", topic)
    return next((row["cursor"] for row in rows if row["subscription"] == subscription), None)


def _producer_keys(metadata, topic: str) -> set[str]:
    return {key for key, _ in metadata.get_prefix(f"/topics{topic}/producers/", keys_only=True)}


def _check_kept_after_unload(metadata, broker_a: BrokerProcess, topic: str, producers_on_a: set[str]) -> None:
    """What A keeps and deletes once it has unloaded `topic` (spec §6.2). The client may have
    created its producer again on B by now, under a new id: only A's keys must be gone."""
    assert len(producers_on_a) == 1 and not producers_on_a & _producer_keys(metadata, topic)
    assert metadata.get(f"/topics{topic}/delivery") == b'"Reliable"'
    assert json.loads(metadata.get(f"/topics{topic}/subscriptions/subs_reliable"))["subscription_name"] == "subs_reliable"
    assert metadata.get(f"/topics{topic}/subscriptions/subs_reliable/cursor") == b"13"
    registration = BrokerRegistration.from_json(metadata.get(f"/cluster/register/{broker_a.broker_id}"), "register")
    assert registration.wal_url == "file://" + os.path.abspath(broker_a.wal_dir)
    directory = os.path.join(broker_a.wal_dir, *topic.strip("/").split("/"))
    assert read_checkpoint(os.path.join(directory, "wal.ckpt"), WalCheckpoint).last_offset == 21
    assert read_checkpoint(os.path.join(directory, "uploader.ckpt"), UploaderCheckpoint).last_committed_offset == 21
    kept = list(read_segments(ReadOnlyWal.open(directory, LocalFileSystem()).segments(), 0))
    assert [(m.msg_id.topic_offset, m.payload) for m in kept] == [(i, f"msg-{i}".encode()) for i in range(22)]


async def _receive(queue: asyncio.Queue, count: int, timeout_s: float = 60.0) -> list:
    return [await asyncio.wait_for(queue.get(), timeout_s) for _ in range(count)]


def test_seed_003_reliable_topic_moves_between_brokers(etcd_endpoint, metadata, tmp_path, unique_name):
    cloud = str(tmp_path / "cloud-storage")
    broker_a = BrokerProcess(etcd_endpoint, tmp_path, "broker-a", cloud).start()
    broker_b = None
    topic = f"/default/{unique_name('reliable_topic')}"
    try:
        run_admin(etcd_endpoint, "topics", "create", topic, "--delivery", "reliable")
        eventually(lambda: _owner(etcd_endpoint, "default", topic) == broker_a.broker_id, 20)
        broker_b = BrokerProcess(etcd_endpoint, tmp_path, "broker-b", cloud).start()

        async def scenario() -> list:
            client, producer = await reliable_producer(broker_a.url, topic, "prod_reliable",
                                                       ProducerOptions(max_retries=3, base_backoff_ms=100))
            consumer = (client.new_consumer().with_topic(topic).with_consumer_name("cons_reliable")
                        .with_subscription("subs_reliable").with_subscription_type(SubType.EXCLUSIVE).build())
            await consumer.subscribe()
            queue = await consumer.receive()
            for i in range(22):
                await producer.send(f"msg-{i}".encode(), {"n": str(i)})
            first = await _receive(queue, 22)
            assert [m.msg_id.topic_offset for m in first] == list(range(22))
            for msg in first[:14]:
                await consumer.ack(msg)

            producers_on_a = await asyncio.to_thread(_producer_keys, metadata, topic)
            await asyncio.to_thread(run_admin, etcd_endpoint, "topics", "unload", topic)
            await asyncio.to_thread(eventually, lambda: _owner(etcd_endpoint, "default", topic) == broker_b.broker_id, 30)
            await asyncio.to_thread(_check_kept_after_unload, metadata, broker_a, topic, producers_on_a)
            for i in range(22, 28):
                await producer.send(f"msg-{i}".encode(), {"n": str(i)})
            after = await _receive(queue, 14)
            for msg in after:
                await consumer.ack(msg)
            extra = await asyncio.wait_for(queue.get(), 1.0) if not queue.empty() else None
            assert extra is None, f"unexpected extra delivery at offset {extra.msg_id.topic_offset}"
            await producer.close()
            await consumer.close()
            return after

        after = asyncio.run(scenario())
        assert [m.msg_id.topic_offset for m in after] == list(range(14, 28))
        assert [m.payload for m in after] == [f"msg-{i}".encode() for i in range(14, 28)]
        assert all(m.msg_id.broker_addr == broker_b.url for m in after if m.msg_id.topic_offset >= 22)
        eventually(lambda: _cursor(etcd_endpoint, topic, "subs_reliable") == 27, 20)
        storage = run_admin(etcd_endpoint, "topics", "storage", topic)
        descriptors = [row["value"] for row in storage if row["kind"] == "descriptor"]
        starts = [d["start_offset"] for d in descriptors]
        assert starts[0] == 0 and starts[1:] == [d["end_offset"] + 1 for d in descriptors[:-1]]
        assert 21 in [d["end_offset"] for d in descriptors], "A sealed after uploading exactly 0..21"
        for broker in (broker_a, broker_b):
            assert_shape_of_a_golden_load(metadata.get(f"/cluster/load/{broker.broker_id}"))
        eventually(lambda: b"/default/" in metadata.get(f"/cluster/load/{broker_b.broker_id}"), 10)
        assert_shape_of_a_golden_load(metadata.get(f"/cluster/load/{broker_b.broker_id}"))
    finally:
        for broker in (broker_b, broker_a):
            if broker is not None:
                broker.stop()


def test_unloading_an_empty_reliable_topic_moves_it_without_a_seal(etcd_endpoint, tmp_path, unique_name):
    """Nothing was ever appended, so no sealed state is written: the old owner's "released"
    mark on the marker is what lets the leader reassign at once (not after its seal wait)."""
    cloud = str(tmp_path / "cloud-storage")
    brokers = [BrokerProcess(etcd_endpoint, tmp_path, "broker-a", cloud).start()]
    topic = f"/default/{unique_name('empty')}"
    try:
        run_admin(etcd_endpoint, "topics", "create", topic)
        eventually(lambda: _owner(etcd_endpoint, "default", topic) == brokers[0].broker_id, 20)
        brokers.append(BrokerProcess(etcd_endpoint, tmp_path, "broker-b", cloud).start())
        run_admin(etcd_endpoint, "topics", "unload", topic)
        eventually(lambda: _owner(etcd_endpoint, "default", topic) == brokers[1].broker_id, 15)
        storage = run_admin(etcd_endpoint, "topics", "storage", topic)
        assert [row["value"] for row in storage if row["kind"] == "sealed_state"] == [None]
    finally:
        for broker in reversed(brokers):
            broker.stop()


def test_unloading_a_non_reliable_topic_deletes_its_subscriptions_as_the_broker_does(
        etcd_endpoint, metadata, tmp_path, unique_name):
    """§5.3: a non-reliable unload removes the subscription records (their consumers subscribe
    again at the next owner) and the producers; the delivery key and the index stay."""
    cloud = str(tmp_path / "cloud-storage")
    brokers = [BrokerProcess(etcd_endpoint, tmp_path, "broker-a", cloud).start()]
    topic = f"/default/{unique_name('non_reliable')}"
    subscription = f"/topics{topic}/subscriptions/s_shared"
    try:
        run_admin(etcd_endpoint, "topics", "create", topic, "--delivery", "non-reliable")
        eventually(lambda: _owner(etcd_endpoint, "default", topic) == brokers[0].broker_id, 20)
        metadata.put(subscription, b'{"consumer_id":null,"consumer_name":"c","subscription_name":"s_shared",'
                                   b'"subscription_type":1}')
        brokers.append(BrokerProcess(etcd_endpoint, tmp_path, "broker-b", cloud).start())
        run_admin(etcd_endpoint, "topics", "unload", topic)
        eventually(lambda: _owner(etcd_endpoint, "default", topic) == brokers[1].broker_id, 15)
        assert metadata.get(subscription) is None
        assert metadata.get(f"/topics{topic}/delivery") == b'"NonReliable"'
        assert metadata.get(f"/namespaces{topic.replace('/default', '/default/topics/default', 1)}") == b"null"
    finally:
        for broker in reversed(brokers):
            broker.stop()
