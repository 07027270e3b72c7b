"""The console's pages against an in-memory etcd and topics built in the broker's layout on local
files (`tests.topic_builder`): the numbers shown are etcd's, a page of messages is decoded with
its schema (or shown raw), and bad input is named on the page while the rest renders: etcd
unreachable, a broker metrics endpoint that does not answer, a deleted topic, an action
without its token (refused, nothing sent)."""

from __future__ import annotations

import dataclasses
import html
import json
import re
import time

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
from danube_core.records import (
    BrokerRegistration, LoadReport, ResourceUsage, SubscriptionRecord, dump_cursor, dump_json,
)
from danube_core.ports import free_port
from danube_core.schema_registry import register_schema
from tests.topic_builder import TopicBuilder

pytestmark = pytest.mark.unit

SCHEMA = {"type": "object", "properties": {"order_id": {"type": "string"}}}
AVRO_SCHEMA = {"type": "record", "name": "Payment",
               "fields": [{"name": "order_id", "type": "string"}, {"name": "amount", "type": "long"}]}


def avro_long(n: int) -> bytes:
    """Avro's int/long encoding (zig-zag, then a base-128 varint), written here by hand so the
    test pins the wire format rather than the library that decodes it."""
    z, out = (n << 1) ^ (n >> 63), bytearray()
    while z > 0x7F:
        out.append(z & 0x7F | 0x80)
        z >>= 7
    return bytes(out + bytes([z]))


def avro_payment(order_id: str, amount: int) -> bytes:
    text = order_id.encode()
    return avro_long(len(text)) + text + avro_long(amount)


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


def test_topic_page_shows_wal_tail_cursor_and_lag_against_the_head(platform):
    metadata, store, _ = platform
    page = client_for(metadata, store).get("/topics/default/orders")
    assert page.status_code == 200
    assert cell(page.text, "data-partition", "/default/orders-part-0", "owner") == "7"
    assert cell(page.text, "data-partition", "/default/orders-part-0", "wal") == "0..24"
    assert cell(page.text, "data-partition", "/default/orders-part-0", "newest") == "24"
    sub = "/default/orders-part-0|orders-delta"
    assert cell(page.text, "data-subscription", sub, "head") == "24"
    assert cell(page.text, "data-subscription", sub, "lag-messages") == "9"  # 24 - 15
    # the data source's record is detail beside it, with its age: written in 1970, so stale
    assert cell(page.text, "data-subscription", sub, "recorded-messages") == "9"
    assert cell(page.text, "data-subscription", sub, "recorded-seconds") == "4.0"
    assert "(stale: its query is not writing it)" in cell(page.text, "data-subscription", sub, "recorded-age")
    # no record of lag (a broker consumer's): the same head minus cursor
    assert cell(page.text, "data-subscription", "/default/orders-part-1|other", "lag-messages") == "21"
    assert cell(page.text, "data-subscription", "/default/orders-part-1|other", "recorded-age") \
        == "no record (not the data source's)"


def put_lag_record(metadata, topic: str, subscription: str, messages: int, updated_at: int) -> None:
    record = SubscriptionRecord(None, "spark", subscription, 0).to_value()
    metadata.put(keys.subscription_key(topic, subscription), dump_json(
        {**record, "lag": {"messages": messages, "bytes": 0, "ms": 0, "updated_at": updated_at}}))


def test_stopped_pipeline_lag_is_head_minus_cursor_not_its_last_record(platform, tmp_path):
    """Issue 41: a pipeline stopped after catching up left "lag 0" in its record; 50 orders
    later the topic page still said 0 while /pipelines said behind 50."""
    metadata, store, builders = platform
    topic = "/default/orders-part-0"
    put_lag_record(metadata, topic, "orders-delta", 0, int(time.time()) - 3600)  # caught up, an hour ago
    metadata.put(keys.cursor_key(topic, "orders-delta"), dump_cursor(24))
    builders[0].append(50, payload=lambda o: json.dumps({"order_id": f"o-{o}"}).encode())
    builders[0].upload()  # 25..74 uploaded: the head etcd shows
    client = client_for(metadata, store, pipelines=(pipeline_file(tmp_path),))
    from tests.rig import eventually

    page = eventually(lambda: (r := client.get("/topics/default/orders")) and
                      cell(r.text, "data-partition", topic, "newest-uploaded") == "74" and r)
    sub = f"{topic}|orders-delta"
    assert cell(page.text, "data-subscription", sub, "lag-messages") == "50"
    assert cell(page.text, "data-subscription", sub, "recorded-messages") == "0"
    assert "stale" in cell(page.text, "data-subscription", sub, "recorded-age")
    pipelines = client.get("/pipelines").text
    assert cell(pipelines, "data-partition", topic, "behind") == "50"


def test_lag_counts_offsets_only_in_the_wal(platform):
    """Issue 41: cursor 254 with 250..269 only in the WAL showed lag 0 "computed from the
    cursor" beside a newest offset of 269, and the chart recorded 0 for that window."""
    metadata, store, builders = platform
    topic = "/default/orders-part-1"
    metadata.put(keys.cursor_key(topic, "other"), dump_cursor(19))  # a broker consumer at the last uploaded
    put_lag_record(metadata, "/default/orders-part-0", "orders-delta", 0, int(time.time()))  # fresh, but 0
    metadata.put(keys.cursor_key("/default/orders-part-0", "orders-delta"), dump_cursor(19))
    base = ConsoleConfig(storage_url=store.url, history_samples=10, page_messages=10)
    services = ConsoleServices(base, connect=lambda: metadata, sample_lag=False)
    services.start()
    assert services.etcd.wait_ready(10)
    from tests.rig import eventually

    page = eventually(lambda: (r := TestClient(build_app(services)).get("/topics/default/orders")) and
                      cell(r.text, "data-subscription", f"{topic}|other", "cursor") == "19" and r)
    assert cell(page.text, "data-partition", topic, "newest") == "24"
    assert cell(page.text, "data-subscription", f"{topic}|other", "lag-messages") == "5"
    assert cell(page.text, "data-subscription", "/default/orders-part-0|orders-delta", "lag-messages") == "5"
    # the chart's samples count the WAL too (the sampler's own rows, as its thread takes them)
    services.lag_history.record(services._subscriptions())
    assert services.lag_history.series(topic, "other")[-1][1] == 5
    assert services.lag_history.series("/default/orders-part-0", "orders-delta")[-1][1] == 5
    services.close()


def test_subscription_behind_and_growing_is_highlighted(platform):
    metadata, store, builders = platform
    topic = "/default/orders-part-1"
    base = ConsoleConfig(storage_url=store.url, history_samples=10, page_messages=10)
    services = ConsoleServices(base, connect=lambda: metadata, sample_lag=False)
    services.start()
    assert services.etcd.wait_ready(10)
    client = TestClient(build_app(services))
    for _ in range(3):
        services.lag_history.record(services._subscriptions())
        builders[1].append(4, payload=lambda o: b"{}")
    services.lag_history.record(services._subscriptions())
    page = client.get("/topics/default/orders")
    assert [p[1] for p in services.lag_history.series(topic, "other")][-4:] == [21, 25, 29, 33]
    row = re.search(rf'<tr data-subscription="{topic}\|other" class="growing">(.*?)</tr>', page.text, re.S)
    assert row and 'data-field="growing">behind and growing' in row.group(1)
    assert 'data-subscription="/default/orders-part-0|orders-delta" class="growing"' not in page.text  # not moving
    services.close()


@pytest.mark.parametrize("path", ["/topics/default/bad.name", "/topics/default/a%20b",
                                  "/topics/default/bad.name/messages", "/topics/default/a%20b/messages"])
def test_invalid_topic_name_is_a_400_naming_the_expected_form(platform, path):
    metadata, store, _ = platform
    page = client_for(metadata, store).get(path)
    assert page.status_code == 400, page.status_code
    assert "invalid topic name" in page.text and "expected the form /{namespace}/{topic}" in page.text


@pytest.mark.parametrize("query, expected", [
    ("partition=7", "partition=&#39;7&#39; is not a partition of /default/orders: expected one of 0, 1, 2"),
    ("offset=-5", "offset=&#39;-5&#39;: expected an offset, a whole number from 0"),
    ("offset=abc&partition=1", "offset=&#39;abc&#39;: expected an offset"),
])
def test_browser_parameter_it_cannot_show_is_a_400_naming_it(platform, query, expected):
    metadata, store, _ = platform
    page = client_for(metadata, store).get(f"/topics/default/orders/messages?{query}")
    assert page.status_code == 400 and expected in page.text, page.text


def test_partition_asked_of_an_unpartitioned_topic_is_a_400(platform):
    metadata, store, _ = platform
    page = client_for(metadata, store).get("/topics/default/raw/messages?partition=7")
    assert page.status_code == 400
    assert "expected no partition parameter: the topic is not partitioned" in page.text


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


def message_row(page: str, offset: int) -> str:
    """The unescaped cells of the browser's row for `offset`."""
    row = re.search(rf'<tr data-offset="{offset}">(.*?)</tr>', page, re.S)
    assert row, f"no row for offset {offset}"
    return html.unescape(row.group(1))


def shown_payload(row: str) -> tuple[str, str]:
    found = re.search(r'<pre class="payload" data-shown="(\w+)">(.*?)</pre>', row, re.S)
    assert found, f"no payload in {row}"
    return found.group(1), found.group(2)


def test_browser_decodes_avro_payloads_and_shows_one_its_schema_does_not_read_as_hex_with_the_error(
        platform, tmp_path):
    metadata, store, _ = platform
    register_schema(metadata, "payments", "Avro", json.dumps(AVRO_SCHEMA))
    topic = TopicBuilder(metadata, store, str(tmp_path / "wal"), "/default/payments", broker_id=7)
    truncated = avro_long(16) + b"ab"  # a 16-byte order_id of which 2 bytes are there
    topic.append(6, payload=lambda o: truncated if o == 3 else avro_payment(f"p-{o}", o * 1000))
    topic.upload()
    metadata.put(keys.schema_subject_key("/default/payments"), dump_json("payments"))
    page = client_for(metadata, store).get("/topics/default/payments/messages")
    assert page.status_code == 200
    # the builder's odd offsets name no schema version: they take the topic's subject's latest
    for offset in (1, 5):
        row = message_row(page.text, offset)
        shown, payload = shown_payload(row)
        assert shown == "json" and "payments v1 (Avro)" in row
        assert json.loads(payload) == {"order_id": f"p-{offset}", "amount": offset * 1000}
        assert payload.index('"order_id"') < payload.index('"amount"')  # the schema's field order
        assert 'class="note"' not in row
    bad = message_row(page.text, 3)
    assert shown_payload(bad) == ("hex", "20 61 62")  # hex although " ab" is printable text
    assert "not Avro data of its schema: EOFError" in bad and "payments v1 (Avro)" in bad


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


def test_broker_load_figures_say_their_units(platform):
    metadata, store, _ = platform
    usage = [ResourceUsage("CPU", 12.5), ResourceUsage("Memory", 40.0), ResourceUsage("DiskIO", 0.0),
             ResourceUsage("NetworkIO", 3 * 1024 * 1024.0)]
    metadata.put(keys.load_key(7), LoadReport(7, usage, 1_700_000_000, [], 0, 0, 0.0).to_json())
    page = eventually_page(client_for(metadata, store), "/brokers", 'data-field="cpu">12.5')
    assert cell(page, "data-broker", "7", "cpu") == "12.5 %"
    assert cell(page, "data-broker", "7", "memory") == "40.0 %"
    assert cell(page, "data-broker", "7", "disk-io") == "0 B/s"
    assert cell(page, "data-broker", "7", "network-io") == "3.0 MiB/s"


def eventually_page(client: TestClient, path: str, shows: str) -> str:
    from tests.rig import eventually

    def shown() -> str | None:
        text = client.get(path).text
        return text if shows in text else None

    return eventually(shown)


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


# ---- pipelines ------------------------------------------------------------------------------

def pipeline_file(tmp_path, **changes) -> str:
    """A pipeline reading /default/orders as `orders-delta` into a target under `tmp_path`
    whose quarantine table does not exist (the pages must not need it), feeding demo/orders."""
    import yaml

    from tests.unit.test_pipeline_config import with_changes

    data = with_changes(None, target={"path": str(tmp_path / "lake" / "orders")},
                        quarantine={"path": str(tmp_path / "lake" / "never-written")},
                        speedlayer={"tenant": "demo", "dataset": "orders"}, **changes)
    data["source"] = {**data["source"], "subscription": "orders-delta"}
    path = tmp_path / "orders.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def commit(location: str, meta: dict) -> None:
    """One commit to the target with the sink's `userMetadata`."""
    import pyarrow as pa
    from deltalake import CommitProperties, write_deltalake

    write_deltalake(location, pa.table({"order_id": ["o"]}), mode="append",
                    commit_properties=CommitProperties(custom_metadata={"userMetadata": json.dumps(meta)}))


def test_pipeline_page_reads_counts_reasons_and_durations_from_the_target_log(platform, tmp_path, monkeypatch):
    import time

    import deltalake

    from pipelines.delta_sink import commit_metadata
    from pipelines.metrics import OffsetSpan

    metadata, store, _ = platform
    file = pipeline_file(tmp_path)
    target = str(tmp_path / "lake" / "orders")
    spans = {"/default/orders-part-0": OffsetSpan(0, 10, 10, ())}
    # batch 0 as the first release wrote it: counts, no reasons, no start time
    commit(target, {"pipeline": "orders", "batch_id": 0, "offsets": {"/default/orders-part-0": {"start": 0, "end": 10}},
                    "counts": {"rows": 10, "target": 8, "quarantine": 2}})
    started = int(time.time() * 1000) - 1500
    for batch_id, reasons in ((1, {"decode": 1, "expect_column_values_to_be_between(amount)": 2}),
                              (2, {"expect_column_values_to_be_between(amount)": 1})):
        quarantined = sum(reasons.values())
        commit(target, json.loads(commit_metadata(
            "orders", batch_id, spans, counts={"valid": 10 - quarantined, "decode": reasons.get("decode", 0),
                                               "expectations": quarantined - reasons.get("decode", 0)},
            reasons=reasons, started_ms=started)))
    history = {json.loads(c["userMetadata"])["batch_id"]: c for c in deltalake.DeltaTable(target).history()}

    opened: list[str] = []
    real = deltalake.DeltaTable
    monkeypatch.setattr(deltalake, "DeltaTable", lambda location, *a, **k: opened.append(location) or real(location, *a, **k))
    page = client_for(metadata, store, pipelines=(file,)).get("/pipelines/orders")
    assert page.status_code == 200, page.text
    # the target's log tail, then the quarantine table for batch 1's decode failure (never written here)
    assert opened == [target, str(tmp_path / "lake" / "never-written")]
    assert f"quarantine table {tmp_path / 'lake' / 'never-written'} unreadable" in page.text

    assert cell(page.text, "data-batch", "2", "rows-quarantined") == "1"
    assert cell(page.text, "data-batch", "1", "rows-written") == "7"
    assert cell(page.text, "data-batch", "1", "duration") == f"{(history[1]['timestamp'] - started) / 1000:.2f} s"
    assert cell(page.text, "data-batch", "0", "duration") == "—"  # an older commit: not recorded
    assert cell(page.text, "data-batch", "0", "reasons") == "—"
    assert cell(page.text, "data-reason", "expect_column_values_to_be_between(amount)", "count") == "3"
    assert cell(page.text, "data-reason", "decode", "count") == "1"
    assert 'id="unexplained">1 of these batches' in page.text


def test_pipeline_page_splits_decode_failures_by_the_errors_in_the_quarantine_table(platform, tmp_path):
    """Issue 41: "decode: 10" where the quarantine table held two reasons."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from pipelines.delta_sink import commit_metadata
    from pipelines.metrics import OffsetSpan

    metadata, store, _ = platform
    file = pipeline_file(tmp_path)
    target, quarantine = str(tmp_path / "lake" / "orders"), str(tmp_path / "lake" / "never-written")
    spans = {"/default/orders-part-0": OffsetSpan(0, 20, 20, ())}
    for batch_id, reasons in ((4, {"decode": 10, "amount_positive": 1}), (5, {})):
        quarantined = sum(reasons.values())
        commit(target, json.loads(commit_metadata(
            "orders", batch_id, spans, counts={"valid": 20 - quarantined, "decode": reasons.get("decode", 0),
                                               "expectations": reasons.get("amount_positive", 0)},
            reasons=reasons, started_ms=1)))
    errors = ["not JSON: Expecting value"] * 7 + ["does not match its schema: order_id is required"] * 3
    write_deltalake(quarantine, pa.table({
        "_pipeline": ["orders"] * 11 + ["other"], "_batch_id": pa.array([4] * 11 + [4], pa.int64()),
        "_decode_error": [*errors, None, "from another pipeline"]}))
    page = client_for(metadata, store, pipelines=(file,)).get("/pipelines/orders")
    assert page.status_code == 200, page.text
    assert cell(page.text, "data-reason", "decode: not JSON: Expecting value", "count") == "7"
    assert cell(page.text, "data-reason", "decode: does not match its schema: order_id is required", "count") == "3"
    assert cell(page.text, "data-reason", "amount_positive", "count") == "1"
    assert 'data-reason="decode"' not in page.text  # every decode failure explained


def test_pipelines_page_sets_cursors_against_heads_and_the_announcement_against_the_epoch(platform, tmp_path):
    from speedlayer.announce import announce
    from speedlayer.keys import SpeedLayerKeys
    from speedlayer.records import AssignmentRecord

    metadata, store, _ = platform
    client = client_for(metadata, store, pipelines=(pipeline_file(tmp_path),))
    page = client.get("/pipelines")
    assert page.status_code == 200
    section = re.search(r'<section class="pipeline" data-pipeline="orders">(.*?)</section>', page.text, re.S).group(1)
    assert cell(section, "data-partition", "/default/orders-part-0", "cursor") == "15"
    assert cell(section, "data-partition", "/default/orders-part-0", "head") == "24"  # 20 uploaded, 5 in the WAL
    assert cell(section, "data-partition", "/default/orders-part-0", "behind") == "9"
    assert cell(section, "data-partition", "/default/orders-part-1", "cursor") == "—"  # not this subscription's
    assert "nothing announced yet" in section

    announce(metadata, "demo", "orders", str(tmp_path / "lake" / "orders"), version=7, writer="orders",
             committed_ms=1_700_000_000_000)
    keys = SpeedLayerKeys()
    metadata.put(keys.assignment("demo", "orders", "e1"), AssignmentRecord(
        "demo", "orders", "e1", "r1", "READY", version=6, created_ms=1).to_json())
    from tests.rig import eventually

    def shown() -> str | None:
        text = client.get("/pipelines").text
        return text if 'data-field="announced-version">7<' in text else None

    text = eventually(shown)
    assert re.search(r'data-field="epoch-version">6<', text) and 'data-field="epoch-status">READY<' in text
    assert 'data-field="announcement-pending">not planned yet<' in text
    metadata.put(keys.assignment("demo", "orders", "e2"), AssignmentRecord(
        "demo", "orders", "e2", "r2", "ASSIGNED", version=7, created_ms=2).to_json())
    detail = eventually(lambda: (t := client.get("/pipelines/orders").text) and 'epoch-version">7<' in t and t)
    assert "announcement-pending" not in detail and 'data-field="announced-version">7<' in detail


def test_speedlayer_page_says_which_datasets_serve_their_topics_tail(platform):
    from speedlayer.keys import SpeedLayerKeys
    from speedlayer.records import DatasetSpec
    from speedlayer.tail_spec import TailSpec
    from tests.rig import eventually

    metadata, store, _ = platform
    client = client_for(metadata, store)
    keys = SpeedLayerKeys()
    metadata.put(keys.dataset_spec("demo", "fresh"), DatasetSpec("delta", "/lake/fresh", tail=TailSpec("x").to_json()).to_json())
    metadata.put(keys.dataset_spec("demo", "plain"), DatasetSpec("delta", "/lake/plain").to_json())
    text = eventually(lambda: (t := client.get("/speedlayer").text) and "/lake/plain" in t and "/lake/fresh" in t and t)
    fresh = text.split("/lake/fresh", 1)[1].split("</h4>", 1)[0]
    plain = text.split("/lake/plain", 1)[1].split("</h4>", 1)[0]
    assert "with its topic's tail" in fresh and "tail" not in plain


def test_speedlayer_page_shows_each_workers_tail_lag_age_rows_and_hand_overs(platform):
    """Scraped from the workers' own metrics endpoints, registered with their records; a worker
    that does not answer is named, and a dataset without a tail gets no tail table."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

    from speedlayer.keys import SpeedLayerKeys
    from speedlayer.records import DatasetSpec, WorkerRecord
    from speedlayer.tail_spec import TailSpec
    from tests.rig import eventually

    registry = CollectorRegistry()
    Gauge("worker_tail_lag_messages", "", ["dataset"], registry=registry).labels(dataset="fresh").set(42)
    Gauge("worker_tail_age_seconds", "", ["dataset"], registry=registry).labels(dataset="fresh").set(0.25)
    Gauge("worker_tail_rows", "", ["dataset"], registry=registry).labels(dataset="fresh").set(1500)
    Counter("worker_tail_handovers", "", ["dataset"], registry=registry).labels(dataset="fresh").inc(7)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        metadata, store, _ = platform
        client = client_for(metadata, store)
        keys = SpeedLayerKeys()
        metadata.put(keys.dataset_spec("demo", "fresh"), DatasetSpec("delta", "/lake/fresh", tail=TailSpec("x").to_json()).to_json())
        metadata.put(keys.dataset_spec("demo", "plain"), DatasetSpec("delta", "/lake/plain").to_json())
        metadata.put(keys.worker("demo", "w1"), WorkerRecord("127.0.0.1:1", 1 << 30, 2, "m1",
                                                            metrics_address=f"127.0.0.1:{server.server_port}").to_json())
        metadata.put(keys.worker("demo", "w2"), WorkerRecord("127.0.0.1:2", 1 << 30, 2, "m1",
                                                            metrics_address="127.0.0.1:1").to_json())
        text = eventually(lambda: (t := client.get("/speedlayer").text) and 'data-tail-worker="w1"' in t and t)
        row = text.split('data-tail-worker="w1"', 1)[1].split("</tr>", 1)[0]
        assert 'data-field="tail-lag">42<' in row and 'data-field="tail-age">0.2 s<' in row
        assert 'data-field="tail-rows">1500<' in row and 'data-field="tail-handovers">7<' in row
        assert 'data-tail-worker="w2"' not in text and "127.0.0.1:1/metrics unreachable" in text
        plain = text.split('data-dataset="plain"', 1)[1].split("</div>", 1)[0]
        assert "tails" not in plain
    finally:
        server.shutdown()
        thread.join(5)
