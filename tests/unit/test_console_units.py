"""The console's pure parts: its configuration, Prometheus text and histogram quantiles,
payload display, and the lag history's bound."""

from __future__ import annotations

import json

import pytest

from console.config import load_console_config
from console.lag_history import LagHistory
from console.message_view import show_payload
from tests.unit.test_console_pages import avro_long
from console.metrics_scrape import Sample, Scrape, histogram_quantile, metrics_url
from console.topics import RECORD_INTERVAL_S, RecordedLag, SubscriptionRow
from danube_core.errors import ConfigError
from danube_core.schema_records import SchemaDef

pytestmark = pytest.mark.unit


def test_config_defaults_read_only_on_loopback():
    config = load_console_config(None, environ={})
    assert (config.host, config.port, config.actions_enabled) == ("127.0.0.1", 8090, False)


def test_config_env_overrides_and_etcd_section(tmp_path):
    file = tmp_path / "console.yaml"
    file.write_text("etcd: {endpoints: 'a:1', user: u}\nlisten: {port: 9000}\n")
    config = load_console_config(str(file), environ={"CONSOLE_ETCD__PASSWORD": "pw", "CONSOLE_LISTEN__PORT": "9001"})
    assert config.port == 9001 and config.etcd.user == "u" and config.etcd.password == "pw"
    assert "pw" not in repr(config)


def test_config_refuses_actions_without_a_token_and_unknown_keys(tmp_path):
    with pytest.raises(ConfigError, match="no token"):
        load_console_config(None, allow_actions=True, environ={})
    config = load_console_config(None, allow_actions=True, environ={"CONSOLE_ACTIONS__TOKEN": "t0k"})
    assert config.actions_enabled and "t0k" not in repr(config)
    file = tmp_path / "bad.yaml"
    file.write_text("etcd: {endpoint: x}\n")
    with pytest.raises(ConfigError, match="etcd.endpoint: unknown key"):
        load_console_config(str(file), environ={})
    for text, key in (("listen: {prot: 1}", "listen.prot"), ("pipelines: {metrics: {}}", "pipelines.metrics"),
                      ("speedlayer: {master: [a]}", "speedlayer.master"), ("browser: {page: 3}", "browser.page")):
        file.write_text(text + "\n")
        with pytest.raises(ConfigError, match=rf"{key}: unknown key; accepted: "):
            load_console_config(str(file), environ={})


def test_metrics_url_and_histogram_quantile():
    assert metrics_url("h:1") == "http://h:1/metrics"
    assert metrics_url("https://h/metrics") == "https://h/metrics"
    buckets = [("0.1", 50.0), ("0.5", 90.0), ("1.0", 100.0), ("+Inf", 100.0)]
    scrape = Scrape("e", [Sample("q_seconds_bucket", {"le": le, "outcome": o}, n / 2) for le, n in buckets
                          for o in ("OK", "FAILED")])
    assert histogram_quantile(scrape, "q_seconds", 0.5) == pytest.approx(0.1)
    assert histogram_quantile(scrape, "q_seconds", 0.7) == pytest.approx(0.3)
    assert histogram_quantile(scrape, "absent", 0.5) is None
    assert Scrape("e", problem="down").total("q_seconds_count") is None


def test_payload_shown_decoded_as_text_or_as_hex():
    json_schema = SchemaDef("JsonSchema", "{}", "f")
    assert show_payload(b'{"b":1,"a":2}', json_schema)[:2] == ("json", '{\n  "a": 2,\n  "b": 1\n}')
    shown, _, note = show_payload(b"not json", json_schema)
    assert shown == "text" and "not JSON" in note
    assert show_payload(b"plain words", None) == ("text", "plain words", None)
    assert show_payload(b"\x00\xff", None)[:2] == ("hex", "00 ff")


AVRO_EVENT = {"type": "record", "name": "Event", "fields": [
    {"name": "id", "type": "string"},
    {"name": "raw", "type": "bytes"},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "note", "type": ["null", "string"]},
]}


def test_avro_payload_shown_as_json_with_bytes_as_hex_and_times_in_iso_8601():
    schema = SchemaDef("Avro", json.dumps(AVRO_EVENT), "f")
    payload = b"\x04ab" + b"\x04\x00\xff" + avro_long(1_700_000_000_000) + b"\x02\x04hi"
    shown, text, note = show_payload(payload, schema)
    assert (shown, note) == ("json", None)
    assert json.loads(text) == {"id": "ab", "raw": "00 ff", "at": "2023-11-14T22:13:20+00:00", "note": "hi"}
    shown, text, note = show_payload(payload + b"\x00", schema)  # decodes, with a byte the schema leaves
    assert shown == "json" and json.loads(text)["id"] == "ab" and note.startswith("1 byte(s) left after the record")


def test_avro_payload_its_schema_does_not_read_is_shown_as_hex_with_the_error():
    schema = SchemaDef("Avro", json.dumps(AVRO_EVENT), "f")
    wrong_branch = b"\x04ab\x04\x00\xff" + avro_long(0) + b"\x08"  # union branch 4 of 2
    shown, text, note = show_payload(wrong_branch, schema)
    assert (shown, text) == ("hex", wrong_branch.hex(" "))
    assert note.startswith("not Avro data of its schema: IndexError")
    assert show_payload(b"", schema)[2] == "not Avro data of its schema: EOFError"
    unknown_type = {"type": "record", "name": "R", "fields": [{"name": "x", "type": "Missing"}]}
    unparsable = show_payload(b"ok", SchemaDef("Avro", json.dumps(unknown_type), "f"))
    assert unparsable[:2] == ("hex", "6f 6b")
    assert unparsable[2].startswith("its Avro schema does not parse: UnknownType")


def test_protobuf_payload_shown_as_bytes_saying_the_proto_needs_compiling():
    proto = SchemaDef("Protobuf", 'syntax = "proto3"; message DefaultMessage { string s = 1; }', "f", "DefaultMessage")
    assert show_payload(b"\x0a\x02hi", proto) == (
        "hex", "0a 02 68 69", "Protobuf payloads are shown as bytes: decoding needs the .proto compiled")


def test_lag_history_keeps_the_last_samples():
    history = LagHistory(samples=3)
    for i in range(5):
        history.record([SubscriptionRow("/a/t", "s", None, None, i, 10)], now=float(i))
    assert [p[1] for p in history.series("/a/t", "s")] == [8, 7, 6]


@pytest.mark.parametrize("behind, growing", [
    ([1, 2, 3], True), ([5, 5, 6], True), ([0, 4, 8], False), ([3, 2, 3], False), ([4, 4, 4], False),
    ([2, 3], False), ([6, 5, 4], False),
])
def test_lag_growing_needs_three_samples_behind_and_never_shrinking(behind, growing):
    history = LagHistory(samples=10)
    for i, messages in enumerate(behind):
        history.record([SubscriptionRow("/a/t", "s", None, None, 100 - messages, 100)], now=float(i))
    assert history.growing("/a/t", "s") is growing


def test_recorded_lag_is_stale_after_two_of_its_writer_intervals():
    assert not RecordedLag(0, 0, 0, updated_at=1000).stale(now=1000 + RECORD_INTERVAL_S * 1.5)
    assert RecordedLag(0, 0, 0, updated_at=1000).stale(now=1000 + RECORD_INTERVAL_S * 2 + 1)
    assert RecordedLag(0, 0, 0, updated_at=None).stale(now=1000)
