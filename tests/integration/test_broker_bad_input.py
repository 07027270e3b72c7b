"""Bad requests get the right gRPC status with a clear message; the broker stays up and stores
nothing partial."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from danube import SubType
from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeApi_pb2_grpc as pb_grpc

from broker.topics_registry import TopicRegistry
from danube_core.keys import namespace_policy_key, namespace_topic_key
from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.records import RELIABLE, Policies
from danube_core.topics import TopicName
from tests.integration.broker_process import expect_status, reliable_producer, running_broker

pytestmark = pytest.mark.integration

MAX_MESSAGE_SIZE = 1024


@pytest.fixture(scope="module")
def broker(etcd_endpoint, tmp_path_factory):
    with running_broker(etcd_endpoint, tmp_path_factory, "bad-input") as proc:
        yield proc


def _small_namespace(etcd_endpoint: str, namespace: str) -> None:
    with EtcdMetadataStore(etcd_endpoint) as store:
        store.put(namespace_policy_key(namespace), Policies(max_message_size=MAX_MESSAGE_SIZE).to_json())


def _message(producer_id: int, topic: str, payload: bytes, request_id: int = 1) -> pb.StreamMessage:
    return pb.StreamMessage(request_id=request_id, payload=payload, publish_time=1, producer_name="bad-input-producer",
                            msg_id=pb.MsgID(producer_id=producer_id, topic_name=topic, broker_addr="x"))


def test_bad_requests_get_clear_statuses_and_store_nothing(broker, etcd_endpoint, unique_name):
    namespace = unique_name("ns").replace("-", "_")
    _small_namespace(etcd_endpoint, namespace)
    topic = f"/{namespace}/{unique_name('orders')}"

    async def scenario() -> None:
        client, producer = await reliable_producer(broker.url, topic, "bad-input-producer")
        producer_id = producer._producers[0].producer_id
        async with grpc.aio.insecure_channel(broker.url.removeprefix("http://")) as channel:
            producers = pb_grpc.ProducerServiceStub(channel)
            consumers = pb_grpc.ConsumerServiceStub(channel)
            discovery = pb_grpc.DiscoveryStub(channel)
            await expect_status(grpc.StatusCode.NOT_FOUND, producers.SendMessage(_message(12345, topic, b"x")),
                                "producer 12345")
            await expect_status(grpc.StatusCode.INVALID_ARGUMENT,
                                producers.SendMessage(_message(producer_id, topic, b"x" * (MAX_MESSAGE_SIZE + 1))),
                                str(MAX_MESSAGE_SIZE + 1), "max_message_size")
            for bad_name in ("no-slash", "/a/b/c", "/ns/has space"):
                request = pb.ProducerRequest(request_id=1, producer_name="p", topic_name=bad_name, dispatch_strategy=1)
                await expect_status(grpc.StatusCode.INVALID_ARGUMENT, producers.CreateProducer(request),
                                    "invalid topic name")
            missing = pb.ProducerRequest(request_id=1, producer_name="p", topic_name=f"/{unique_name('nons')}/t",
                                         dispatch_strategy=1)
            await expect_status(grpc.StatusCode.NOT_FOUND, producers.CreateProducer(missing), "namespace")
            await expect_status(grpc.StatusCode.INVALID_ARGUMENT,
                                discovery.TopicLookup(pb.TopicLookupRequest(request_id=1, topic="bad")),
                                "invalid topic name")
            bad_type = pb.ConsumerRequest(request_id=1, topic_name=topic, consumer_name="c", subscription="s",
                                          subscription_type=3)
            await expect_status(grpc.StatusCode.INVALID_ARGUMENT, consumers.Subscribe(bad_type), "subscription type 3")
            stream = consumers.ReceiveMessages(pb.ReceiveRequest(request_id=1, consumer_id=4242))
            await expect_status(grpc.StatusCode.NOT_FOUND, stream.read(), "consumer 4242")
        # The broker is still up and offsets stayed contiguous: nothing partial was stored.
        consumer = (client.new_consumer().with_topic(topic).with_consumer_name("c")
                    .with_subscription("s").with_subscription_type(SubType.EXCLUSIVE).build())
        await consumer.subscribe()
        queue = await consumer.receive()
        for i in range(3):
            await producer.send(f"ok-{i}".encode())
        received = [await asyncio.wait_for(queue.get(), 20) for _ in range(3)]
        assert [m.payload for m in received] == [b"ok-0", b"ok-1", b"ok-2"]
        assert [m.msg_id.topic_offset for m in received] == [0, 1, 2]
        await producer.close()
        await consumer.close()

    asyncio.run(scenario())


def test_producer_without_partitions_on_a_partitioned_topic_gets_the_conflict_not_unavailable(
    broker, etcd_endpoint, unique_name
):
    """Regression: the registry's "partitions exist" conflict was swallowed as a concurrent create,
    and the client retried on UNAVAILABLE "was created; look it up again" though nothing was."""
    base = f"/default/{unique_name('orders')}"
    plain = f"/default/{unique_name('plain')}"
    with EtcdMetadataStore(etcd_endpoint) as store:
        registry = TopicRegistry(store)
        partitions = [str(name) for name in registry.create_partitioned(TopicName.parse(base), 3, RELIABLE)]
        registry.create(TopicName.parse(plain), RELIABLE)

    async def scenario() -> tuple[grpc.aio.AioRpcError, grpc.aio.AioRpcError]:
        from danube import DanubeClientBuilder, DispatchStrategy

        client = await DanubeClientBuilder().service_url(broker.url).build()
        errors = []
        for topic, partition_count in ((base, 0), (plain, 2)):
            builder = (client.new_producer().with_topic(topic).with_name("p")
                       .with_dispatch_strategy(DispatchStrategy.RELIABLE))
            producer = (builder.with_partitions(partition_count) if partition_count else builder).build()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await producer.create()
            errors.append(info.value)
        return errors[0], errors[1]

    unpartitioned, partitioned = asyncio.run(scenario())
    assert unpartitioned.code() == grpc.StatusCode.FAILED_PRECONDITION, unpartitioned.details()
    for words in (["partitioned", "with_partitions(3)", "publish to one partition"], partitions):
        assert all(word in unpartitioned.details() for word in words), unpartitioned.details()
    assert partitioned.code() == grpc.StatusCode.FAILED_PRECONDITION, partitioned.details()
    assert f"{plain} is a non-partitioned topic" in partitioned.details()
    with EtcdMetadataStore(etcd_endpoint) as store:
        created = [name for name in (base, f"{plain}-part-0", f"{plain}-part-1")
                   if store.get(namespace_topic_key(TopicName.parse(name))) is not None]
    assert created == []
