"""The admin CLI against a running broker: namespaces, partitioned and non-reliable topics,
delete; non-reliable topics fan out in memory and store nothing."""

from __future__ import annotations

import asyncio
import io
import json
import os

import pytest
from danube import DanubeClientBuilder, DispatchStrategy, SubType

from broker.admin import main as admin_main
from danube_core.keys import assignment_key, delivery_key, namespace_topic_key
from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.topics import TopicName
from tests.integration.broker_process import run_admin, running_broker
from tests.integration.test_tools import partitioned_topic_with_objects
from tests.rig import eventually

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(etcd_endpoint, tmp_path_factory):
    with running_broker(etcd_endpoint, tmp_path_factory, "admin") as proc:
        yield proc


def _owners(etcd_endpoint: str, namespace: str) -> dict[str, int | None]:
    return {row["topic"]: row["owner"] for row in run_admin(etcd_endpoint, "topics", "list", namespace)}


def test_partitioned_topic_lifecycle_through_the_admin(broker, etcd_endpoint, unique_name):
    namespace = unique_name("sales").replace("-", "_")
    assert run_admin(etcd_endpoint, "namespaces", "create", namespace) == [{"created": namespace}]
    assert namespace in {row["namespace"] for row in run_admin(etcd_endpoint, "namespaces", "list")}
    base = f"/{namespace}/orders"
    created = run_admin(etcd_endpoint, "topics", "create", base, "--partitions", "3")
    assert [row["created"] for row in created] == [f"{base}-part-{k}" for k in range(3)]
    eventually(lambda: set(_owners(etcd_endpoint, namespace).values()) == {broker.broker_id}, 20)

    async def produce() -> None:
        client = await DanubeClientBuilder().service_url(broker.url).build()
        producer = (client.new_producer().with_topic(base).with_name("p").with_partitions(3)
                    .with_dispatch_strategy(DispatchStrategy.RELIABLE).build())
        await producer.create()
        for i in range(6):
            await producer.send(f"x{i}".encode())
        await producer.close()

    asyncio.run(produce())
    eventually(lambda: all(os.path.exists(os.path.join(broker.wal_dir, namespace, f"orders-part-{k}", "wal.log"))
                           for k in range(3)), 10)
    assert [row["deleted"] for row in run_admin(etcd_endpoint, "topics", "delete", base)] == \
        [f"{base}-part-{k}" for k in range(3)]
    partition = TopicName(namespace, "orders-part-0")
    with EtcdMetadataStore(etcd_endpoint) as store:
        eventually(lambda: store.get(assignment_key(broker.broker_id, partition)) is None, 10)
        assert store.get(namespace_topic_key(partition)) is None and store.get(delivery_key(partition)) is None
    eventually(lambda: not os.path.exists(os.path.join(broker.wal_dir, namespace, "orders-part-0")), 20)
    assert run_admin(etcd_endpoint, "topics", "list", namespace) == []


def test_non_reliable_topic_fans_out_in_memory_and_stores_nothing(broker, etcd_endpoint, unique_name):
    name = unique_name("ticks")
    topic = f"/default/{name}"
    run_admin(etcd_endpoint, "topics", "create", topic, "--delivery", "non-reliable")
    eventually(lambda: _owners(etcd_endpoint, "default").get(topic) == broker.broker_id, 20)

    async def scenario() -> list[bytes]:
        client = await DanubeClientBuilder().service_url(broker.url).build()
        consumer = (client.new_consumer().with_topic(topic).with_consumer_name("c").with_subscription("s")
                    .with_subscription_type(SubType.SHARED).build())
        await consumer.subscribe()
        queue = await consumer.receive()
        producer = (client.new_producer().with_topic(topic).with_name("p")
                    .with_dispatch_strategy(DispatchStrategy.NON_RELIABLE).build())
        await producer.create()
        await asyncio.sleep(0.5)  # the consumer's stream must be open: nothing is kept for it
        for i in range(5):
            await producer.send(f"t{i}".encode())
        got = [(await asyncio.wait_for(queue.get(), 10)).payload for _ in range(5)]
        await producer.close()
        await consumer.close()
        return got

    assert asyncio.run(scenario()) == [f"t{i}".encode() for i in range(5)]
    assert not os.path.exists(os.path.join(broker.wal_dir, "default", name))
    storage = run_admin(etcd_endpoint, "topics", "storage", topic)
    assert [row for row in storage if row["kind"] == "descriptor"] == []


def _admin(*argv: str) -> tuple[int, list[dict], str]:
    out, err = io.StringIO(), io.StringIO()
    code = admin_main(list(argv), out, err)
    return code, [json.loads(line) for line in out.getvalue().splitlines()], err.getvalue()


def test_topics_storage_of_a_partitioned_base_name_lists_each_partition_not_null(etcd_endpoint, unique_name):
    """Regression: `topics storage /default/orders` of a 3-partition topic printed one `null` only."""
    with partitioned_topic_with_objects(etcd_endpoint, unique_name, 3) as (base, root, keys, names):
        code, rows, err = _admin("--etcd", etcd_endpoint, "--root-prefix", root, "topics", "storage", str(base))
    assert (code, err) == (0, "")
    assert [row["kind"] for row in rows].count("descriptor") == 1 + 2 + 3
    assert [row["topic"] for row in rows] == [str(name) for name in names for _ in range(name.partition + 2)]
    for name in names:
        kinds = [row["kind"] for row in rows if row["topic"] == str(name)]
        assert kinds == ["descriptor"] * (name.partition + 1) + ["sealed_state"]
        assert all(row["key"].startswith(keys.topic_prefix(name)) for row in rows if row["topic"] == str(name))


def test_topics_storage_of_a_topic_that_does_not_exist_exits_1_naming_it(etcd_endpoint, unique_name):
    topic = f"/default/{unique_name('nothing')}"
    code, rows, err = _admin("--etcd", etcd_endpoint, "topics", "storage", topic)
    assert (code, rows) == (1, [])
    assert err.count("\n") == 1 and f"topic {topic} does not exist" in err
