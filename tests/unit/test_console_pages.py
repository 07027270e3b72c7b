"""The console's pages against an in-memory etcd and topics built in the broker's layout on local
files (`tests.topic_builder`): the numbers shown are etcd's, a page of messages is decoded with
its schema (or shown raw), and bad input is named on the page while the rest renders: etcd
unreachable, a broker metrics endpoint that does not answer, a deleted topic, an action
without its token (refused, nothing sent)."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from starlette.testclient import TestClient

from console import actions
from console.app import build_app
from console.config import ConsoleConfig
from console.services import ConsoleServices
from danube_core import keys
from danube_core.errors import MetadataUnavailableError
from danube_core.metadata_memory import MemoryMetadataStore
from danube_core.objectstore import ObjectStore
from danube_core.records import BrokerRegistration, SubscriptionRecord, dump_cursor, dump_json
from danube_core.schema_registry import register_schema
from devstack.ports import free_port
from tests.topic_builder import TopicBuilder

pytestmark = pytest.mark.unit

SCHEMA = {"type": "object", "properties": {"order_id": {"type": "string"}}}


@pytest.fixture
def platform(tmp_path):
    """An etcd (in memory) and storage holding /default/orders (3 partitions, JSON with a
    schema, uploaded and a WAL tail) and /default/raw (bytes without a schema)."""
    metadata = MemoryMetadataStore()
    store = ObjectStore(str(tmp_path / "cloud"))
    register_schema(metadata, "orders", "JsonSchema", json.dumps(SCHEMA))
    builders = {}
    for k in range(3):
        b = TopicBuilder(metadata, store, str(tmp_path / "wal"), f"/default/orders-part-{k}", broker_id=7)
        b.append(20, payload=lambda o: json.dumps({"order_id": f"o-{o}"}).encode())
        b.upload()
        b.append(5, payload=lambda o: json.dumps({"order_id": f"o-{o}"}).encode())  # the WAL tail
        builders[k] = b
    metadata.put(keys.schema_subject_key("/default/orders-part-0"), dump_json("orders"))  # the topic's subject
    raw = TopicBuilder(metadata, store, str(tmp_path / "wal"), "/default/raw", broker_id=7)
    raw.append(3, payload=lambda o: bytes([0, 255, o]))
    raw.upload()
    sub = keys.subscription_key("/default/orders-part-0", "orders-delta")
    record = SubscriptionRecord(None, "spark", "orders-delta", 0).to_value()
    metadata.put(sub, dump_json({**record, "lag": {"messages": 9, "bytes": 900, "ms": 4000, "updated_at": 1}}))
    metadata.put(keys.cursor_key("/default/orders-part-0", "orders-delta"), dump_cursor(15))
    metadata.put(keys.cursor_key("/default/orders-part-1", "other"), dump_cursor(3))
    yield metadata, store, builders


def client_for(metadata, store, **config) -> TestClient:
    base = ConsoleConfig(storage_url=store.url, history_samples=10, page_messages=10)
    services = ConsoleServices(dataclasses.replace(base, **config), connect=lambda: metadata, sample_lag=False)
    services.start()
    assert services.etcd.wait_ready(10) or config.get("expect_down")
    return TestClient(build_app(services))


def cell(html: str, row_attr: str, row_value: str, field: str) -> str:
    row = re.search(rf'<tr {row_attr}="{re.escape(row_value)}">(.*?)</tr>', html, re.S)
    assert row, f"no row {row_attr}={row_value}"
    found = re.search(rf'data-field="{field}"[^>]*>([^<]*)<', row.group(1))
    assert found, f"no field {field} in {row.group(0)}"
    return found.group(1).strip()


def test_topics_page_shows_partitions_objects_and_subscriptions_from_etcd(platform):
    metadata, store, builders = platform
    page = client_for(metadata, store).get("/topics")
    assert page.status_code == 200 and "Server-Timing" in page.headers
    assert cell(page.text, "data-topic", "/default/orders", "partitions") == "3"
    assert cell(page.text, "data-topic", "/default/orders", "objects") == "3"
    assert cell(page.text, "data-topic", "/default/orders", "newest") == "19"
    assert cell(page.text, "data-topic", "/default/orders", "subscriptions") == "2"
    total = sum(d.size for b in builders.values() for d in b.descriptors)
    assert f'data-value="{total}"' in page.text


def test_topic_page_shows_wal_tail_cursor_and_recorded_lag(platform):
    metadata, store, _ = platform
    page = client_for(metadata, store).get("/topics/default/orders")
    assert page.status_code == 200
    assert cell(page.text, "data-partition", "/default/orders-part-0", "owner") == "7"
    assert cell(page.text, "data-partition", "/default/orders-part-0", "wal") == "0..24"
    assert cell(page.text, "data-partition", "/default/orders-part-0", "newest") == "24"
    assert cell(page.text, "data-subscription", "/default/orders-part-0|orders-delta", "lag-messages") == "9"
    assert cell(page.text, "data-subscription", "/default/orders-part-0|orders-delta", "lag-seconds") == "4.0"
    # no record of lag: computed from the cursor and the newest offset etcd shows
    assert cell(page.text, "data-subscription", "/default/orders-part-1|other", "lag-messages") == "16"


def test_browser_reads_one_page_across_objects_and_wal_decoding_with_the_schema(platform):
    metadata, store, _ = platform
    client = client_for(metadata, store)
    page = client.get("/topics/default/orders/messages?partition=0&offset=15")
    offsets = [int(o) for o in re.findall(r'<tr data-offset="(\d+)">', page.text)]
    assert offsets == list(range(15, 25))  # 5 from the object, 5 from the WAL: one page of 10
    assert 'data-shown="json"' in page.text and "orders v1 (JsonSchema)" in page.text
    assert "&#34;order_id&#34;: &#34;o-15&#34;" in page.text or '"order_id": "o-15"' in page.text
    raw = client.get("/topics/default/raw/messages")
    assert raw.status_code == 200 and 'data-shown="hex"' in raw.text and "00 ff 00" in raw.text


def test_deleted_topic_page_says_so(platform):
    metadata, store, builders = platform
    client = client_for(metadata, store)
    assert client.get("/topics/default/orders").status_code == 200
    for k in range(3):
        metadata.delete(keys.namespace_topic_key(f"/default/orders-part-{k}"))
    from tests.rig import eventually

    page = eventually(lambda: (r := client.get("/topics/default/orders")).status_code == 404 and r)
    assert "topic /default/orders does not exist" in page.text
    assert client.get("/topics/default/orders/messages").status_code == 404


def test_unreachable_etcd_is_named_and_pages_render(tmp_path):
    def down():
        raise MetadataUnavailableError("etcd 127.0.0.1:1 unreachable: connection refused")

    services = ConsoleServices(ConsoleConfig(storage_url=str(tmp_path)), connect=down, sample_lag=False)
    services.start()
    client = TestClient(build_app(services))
    from tests.rig import eventually

    for path in ("/topics", "/brokers", "/pipelines", "/speedlayer"):
        page = eventually(lambda p=path: (r := client.get(p)).status_code == 200 and "connection refused" in r.text
                          and r)
        assert "etcd 127.0.0.1:2379 unreachable" in page.text
    assert client.get("/healthz").status_code == 503
    services.close()


def test_unreachable_broker_metrics_endpoint_is_named(platform):
    metadata, store, _ = platform
    dead = f"127.0.0.1:{free_port()}"
    metadata.put(keys.register_key(7), BrokerRegistration("http://a", "http://b", "http://c", prom_exporter=dead,
                                                          wal_url=None).to_json())
    page = client_for(metadata, store).get("/brokers")
    assert page.status_code == 200
    assert f"metrics endpoint http://{dead}/metrics unreachable" in page.text
    assert cell(page.text, "data-broker", "7", "topics") == "4"


@pytest.mark.parametrize("allowed, token", [(False, None), (True, None), (True, "wrong")])
def test_actions_without_the_token_are_refused_and_nothing_is_sent(platform, monkeypatch, allowed, token):
    metadata, store, _ = platform
    sent = []
    monkeypatch.setattr(actions, "ManagementClient", lambda *a, **k: sent.append(a), raising=False)
    client = client_for(metadata, store, actions_allowed=allowed, action_token="s3cret",
                        speedlayer=dataclasses.replace(ConsoleConfig().speedlayer, masters=("127.0.0.1:1",)))
    form = {"tenant": "acme", "dataset": "d", "table_uri": "/tmp/t", "replication": "1"}
    if token:
        form["token"] = token
    for action in ("admit", "drain"):
        refused = client.post(f"/actions/{action}", data=form)
        assert refused.status_code == 403 and 'data-ok="no"' in refused.text
    assert sent == []
