"""A real broker's Prometheus endpoint (`broker.ports.prometheus`), scraped as Prometheus would:
Danube's metric names with this broker's topic, and the lag of a subscription the data source
committed a cursor and a lag record for (what `connectors.cursor_commit` writes)."""

from __future__ import annotations

import asyncio
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from danube_core.keys import cursor_key, subscription_key
from danube_core.ports import free_port
from danube_core.records import dump_cursor, dump_json
from tests.integration.broker_process import BrokerProcess, reliable_producer
from tests.rig import eventually

pytestmark = pytest.mark.integration


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def publish(url: str, topic: str, count: int) -> None:
    client, producer = await reliable_producer(url, topic, "metrics-producer")
    for i in range(count):
        await producer.send(f"m{i}".encode())


def test_a_broker_exports_topic_counts_and_subscription_lag(etcd_endpoint, metadata, tmp_path, unique_name):
    port, prometheus = free_port(), free_port()
    broker = BrokerProcess(etcd_endpoint, tmp_path, "metrics", str(tmp_path / "cloud"), port=port,
                           broker={"ports": {"client": port, "admin": free_port(), "prometheus": prometheus}}).start()
    topic = f"/default/{unique_name('metrics')}"
    try:
        asyncio.run(publish(broker.url, topic, 5))
        # The data source's commit: its subscription record (with the lag it measured) and a
        # cursor through offset 1 (inclusive), so 3 of the 5 messages are behind.
        metadata.put(subscription_key(topic, "pipeline"), dump_json({
            "consumer_id": None, "consumer_name": "danube-spark", "subscription_name": "pipeline",
            "subscription_type": 0, "lag": {"messages": 3, "bytes": 120, "ms": 1500, "updated_at": 1}}))
        metadata.put(cursor_key(topic, "pipeline"), dump_cursor(1))

        labels = (("broker", str(broker.broker_id)), ("subscription", "pipeline"), ("topic", topic))
        samples = eventually(lambda: (s := scrape(prometheus)).get(("danube_subscription_lag_messages", labels)) == 3.0
                             and s, deadline_s=20)
        by_topic = (("broker", str(broker.broker_id)), ("topic", topic))
        assert samples[("danube_topic_messages_in_total", by_topic)] == 5.0
        assert samples[("danube_topic_bytes_in_total", by_topic)] > 0
        assert samples[("danube_broker_topics_owned", (("broker", str(broker.broker_id)),))] >= 1.0
        assert samples[("danube_subscription_lag_bytes", labels)] == 120.0
        assert samples[("danube_subscription_lag_seconds", labels)] == 1.5
        assert ("danube_leader_election_state", (("broker", str(broker.broker_id)),)) in samples
        assert samples[("process_resident_memory_bytes", ())] > 0
    finally:
        broker.stop()
