"""The official danube-client against our broker: 4,000 messages with attributes, received by an
Exclusive and a Shared subscription, on a reliable topic and on a 3-partition topic; what the
broker wrote (WAL files, cloud objects, etcd keys) decodes with the spec."""

from __future__ import annotations

import asyncio
import glob
import logging
import os
from pathlib import Path

import grpc
import pytest
from danube import DanubeClientBuilder, DispatchStrategy, SubType

from danube_core.frames import iter_messages
from tests.integration.broker_process import BrokerProcess, run_admin

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# Thousands of messages with 64 sends in flight: enough for acks to pile up by the thousand
# (the CANCELLED defect below shows at this size) and for WAL frames to be checked across many
# flushes; 10,000 cost the suite 40 more CPU seconds and found nothing these do not.
COUNT = 4_000
IN_FLIGHT = 64


async def _consume(consumer, expected: int, into: dict, done: asyncio.Event) -> None:
    """Receive (and ack) until the subscription as a whole has `expected` distinct messages."""
    queue = await consumer.receive()
    acks: list[asyncio.Task] = []  # every one awaited at the end: a failed ack fails the test
    while not done.is_set():
        try:
            msg = await asyncio.wait_for(queue.get(), 0.5)
        except asyncio.TimeoutError:
            continue
        into[(msg.msg_id.topic_name, msg.msg_id.topic_offset)] = msg
        acks.append(asyncio.ensure_future(_ack(consumer, msg, len(into), expected)))
        if len(into) >= expected:
            done.set()
    cancelled = sum(not acked for acked in await asyncio.gather(*acks))
    logging.getLogger(__name__).warning("%s: %d of %d acks came back CANCELLED",
                                        getattr(consumer, "_consumer_name", "?"), cancelled, len(acks))


async def _ack(consumer, msg, received: int, expected: int) -> bool:
    """Ack `msg`: True when acknowledged, False when the call came back CANCELLED. Known defect:
    with thousands of acks in flight a few percent are CANCELLED, and again when retried (253,
    268 and 450 of 10,000 per consumer in one run at load 0); RELIABLE dispatch redelivers what
    is not acknowledged, so delivery (what this test checks) is unaffected, and the count is
    logged until it is fixed. Any other failure says which message, of which subscription, how
    far it was."""
    try:
        await consumer.ack(msg)
        return True
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.CANCELLED:
            return False
        raise AssertionError(
            f"ack of {msg.msg_id.topic_name} offset {msg.msg_id.topic_offset} by consumer "
            f"{getattr(consumer, '_consumer_name', '?')!r} ({received}/{expected} received) failed: "
            f"{exc.code().name} {exc.details()!r}") from exc


async def _scenario(url: str, topic: str, partitions: int) -> dict[str, dict]:
    client = await DanubeClientBuilder().service_url(url).build()
    builder = (client.new_producer().with_topic(topic).with_name("bulk")
               .with_dispatch_strategy(DispatchStrategy.RELIABLE))
    producer = (builder.with_partitions(partitions) if partitions else builder).build()
    await producer.create()

    def consumer(name: str, subscription: str, kind: SubType):
        return (client.new_consumer().with_topic(topic).with_consumer_name(name)
                .with_subscription(subscription).with_subscription_type(kind).build())

    exclusive = consumer("excl-1", "exclusive-sub", SubType.EXCLUSIVE)
    shared = [consumer(f"shared-{i}", "shared-sub", SubType.SHARED) for i in range(2)]
    for c in (exclusive, *shared):
        await c.subscribe()
    received = {"exclusive": {}, "shared": {}}
    done = {"exclusive": asyncio.Event(), "shared": asyncio.Event()}
    tasks = [asyncio.create_task(_consume(exclusive, COUNT, received["exclusive"], done["exclusive"]))]
    tasks += [asyncio.create_task(_consume(c, COUNT, received["shared"], done["shared"])) for c in shared]
    slots = asyncio.Semaphore(IN_FLIGHT)

    async def send(i: int) -> None:
        async with slots:
            await producer.send(f"message-{i}".encode(), {"seq": str(i), "kind": "bulk"})

    await asyncio.gather(*(send(i) for i in range(COUNT)))
    await asyncio.wait_for(asyncio.gather(*tasks), 240)
    for c in (exclusive, *shared):
        await c.close()
    await producer.close()
    return received


def _check_received(received: dict, partitions: int) -> None:
    for name, messages in received.items():
        payloads = sorted(m.payload for m in messages.values())
        assert payloads == sorted(f"message-{i}".encode() for i in range(COUNT)), name
        assert all(m.attributes["seq"] == m.payload.decode().split("-")[1] for m in messages.values())
        topics = {topic for topic, _ in messages}
        assert len(topics) == max(partitions, 1), (name, topics)


def _check_wal_files(wal_dir: str, namespace: str, base: str, partitions: int) -> None:
    """Every message is in a WAL frame whose header offset equals the payload's (§1, §2.6)."""
    seqs = []
    names = [f"{base}-part-{k}" for k in range(partitions)] if partitions else [base]
    for name in names:
        offsets = []
        for path in sorted(glob.glob(os.path.join(wal_dir, namespace, name, "wal*.log"))):
            for ref, msg in iter_messages(Path(path).read_bytes(), path):
                assert msg.msg_id.topic_offset == ref.offset
                assert msg.msg_id.topic_name == f"/{namespace}/{name}"
                assert msg.subscription_name == "" and msg.producer_name.startswith("bulk")
                offsets.append(ref.offset)
                seqs.append(int(msg.attributes["seq"]))
        assert offsets == list(range(len(offsets))), name
    assert sorted(seqs) == list(range(COUNT))


@pytest.mark.parametrize("partitions", [0, 3], ids=["reliable-topic", "three-partitions"])
def test_thousands_of_messages_reach_exclusive_and_shared_subscriptions(
    etcd_endpoint, tmp_path, unique_name, partitions
):
    broker = BrokerProcess(etcd_endpoint, tmp_path, "a", str(tmp_path / "cloud")).start()
    base = unique_name("bulk")
    topic = f"/default/{base}"
    try:
        try:
            received = asyncio.run(_scenario(broker.url, topic, partitions))
        except (AssertionError, grpc.RpcError, asyncio.TimeoutError) as exc:
            raise AssertionError(f"{exc!r}\nbroker log ends:\n{broker.log_tail()}") from exc
        _check_received(received, partitions)
        _check_wal_files(broker.wal_dir, "default", base, partitions)
        subscriptions = run_admin(etcd_endpoint, "topics", "subscriptions",
                                  f"{topic}-part-0" if partitions else topic)
        assert {s["subscription"] for s in subscriptions} == {"exclusive-sub", "shared-sub"}
    finally:
        broker.stop()
    # Stopping hands the topics over: everything was uploaded and sealed.
    listed = run_admin(etcd_endpoint, "topics", "storage", f"{topic}-part-0" if partitions else topic)
    sealed = [row for row in listed if row["kind"] == "sealed_state"][0]["value"]
    descriptors = [row["value"] for row in listed if row["kind"] == "descriptor"]
    assert sealed["sealed"] and sealed["last_committed_offset"] == descriptors[-1]["end_offset"]
