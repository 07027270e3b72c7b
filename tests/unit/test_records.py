"""etcd JSON values (spec §5): byte-exact dumps and tolerant-but-checked reads."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, strategies as st

from danube_core.errors import MetadataError
from danube_core.json_text import format_f64
from danube_core.records import (
    BrokerRegistration, BrokerState, CurPointer, LoadReport, ObjectDescriptor, Policies, ProducerRecord,
    SchemaConfig, SealedState, SubscriptionRecord, UnassignedMarker, dump_cursor, dump_delivery,
    dump_json, load_json, parse_cursor, parse_delivery, parse_string,
)
from danube_core.schema_records import (
    SchemaCompatibility, SchemaDef, SchemaIndexEntry, SchemaMetadata, SchemaVersion,
    json_schema_fingerprint,
)

DESCRIPTOR_JSON = (
    b'{"completed":true,"created_at":1700000031,"end_offset":2499,"etag":null,'
    b'"object_id":"data-0-1700000030.dnb1","offset_index":[[0,0],[1000,95000],[2000,190000]],'
    b'"size":237500,"start_offset":0}'
)
SEALED_JSON = b'{"broker_id":9876543210123456789,"last_committed_offset":2499,"sealed":true,"timestamp":1700000100}'
POLICIES_JSON = (
    b'{"max_consumers_per_subscription":0,"max_consumers_per_topic":0,"max_message_size":10485760,'
    b'"max_producers_per_topic":0,"max_publish_rate":0,"max_subscription_dispatch_rate":0,'
    b'"max_subscriptions_per_topic":0}'
)
KEY = "/danube-data/storage/topics/default/orders/objects/00000000000000000000"


def test_dump_json_is_compact_sorted_utf8() -> None:
    assert dump_json({"b": "é", "a": [1, None]}) == '{"a":[1,null],"b":"é"}'.encode()


# What serde_json (ryu) prints: plain decimals for 1e-5 <= |v| < 1e16, else d.ddde<exp>
# with no '+' and no zero padding. Python's repr differs in the exponent rows.
@pytest.mark.parametrize("value,rust", [
    (0.0, "0.0"), (-0.0, "-0.0"), (12.5, "12.5"), (0.1, "0.1"), (123.0, "123.0"),
    (20984695383.0, "20984695383.0"), (9999999999999998.0, "9999999999999998.0"),
    (1e16, "1e16"), (1.2345678901234568e17, "1.2345678901234568e17"), (1.5e300, "1.5e300"),
    (1e-5, "0.00001"), (1.234e-5, "0.00001234"), (0.001234, "0.001234"),
    (1e-6, "1e-6"), (-2.5e-7, "-2.5e-7"), (6.319877954297229e-8, "6.319877954297229e-8"),
    (5e-324, "5e-324"), (1.7976931348623157e308, "1.7976931348623157e308"),
    (math.nan, "null"), (math.inf, "null"),
])
def test_floats_are_formatted_as_serde_json_does(value: float, rust: str) -> None:
    assert format_f64(value) == rust


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_float_format_round_trips(value: float) -> None:
    text = format_f64(value)
    assert float(text) == value and math.copysign(1, float(text)) == math.copysign(1, value)
    assert "+" not in text and "e-0" not in text and ("e" in text or "." in text)


def test_dump_json_writes_rust_floats_in_nested_values() -> None:
    value = {"b": [{"usage": 6.319877954297229e-8, "name": "é"}], "a": 1, "c": None, "d": True}
    expected = '{"a":1,"b":[{"name":"é","usage":6.319877954297229e-8}],"c":null,"d":true}'
    assert dump_json(value) == expected.encode()
    assert json.loads(dump_json(value)) == value


def test_load_report_round_trip() -> None:
    raw = (
        b'{"broker_id":13765396746494901369,"resources_usage":[{"resource":"CPU","usage":0.0},'
        b'{"resource":"Memory","usage":6.319877954297229e-8}],"timestamp":1795442593,"topics":'
        b'[{"backlog_messages":0,"byte_rate":0,"byte_rate_mbps":0.0,"consumer_count":2,'
        b'"message_rate":0,"producer_count":1,"subscription_count":2,"topic_name":"/default/normal"}],'
        b'"total_lag_messages":0,"total_message_rate":0,"total_throughput_mbps":-0.0}'
    )
    report = LoadReport.from_json(raw, "/cluster/load/1")
    assert report.topics[0].consumer_count == 2 and report.resources_usage[1].resource == "Memory"
    assert report.to_json() == raw
    integral = raw.replace(b'"total_throughput_mbps":-0.0', b'"total_throughput_mbps":5')
    assert LoadReport.from_json(integral, "k").to_json().endswith(b'"total_throughput_mbps":5.0}')


def test_spec_5_2_descriptor() -> None:
    desc = ObjectDescriptor("data-0-1700000030.dnb1", 0, 2499, 237500, None, 1700000031, True,
                            [(0, 0), (1000, 95000), (2000, 190000)])
    assert desc.to_json() == DESCRIPTOR_JSON
    assert ObjectDescriptor.from_json(DESCRIPTOR_JSON, KEY) == desc


def test_descriptor_without_index_omits_key() -> None:
    desc = ObjectDescriptor("data-5-1.dnb1", 5, 5, 10, '"abc"', 1)
    assert b"offset_index" not in desc.to_json()
    assert ObjectDescriptor.from_json(desc.to_json(), KEY) == desc


def test_spec_5_2_sealed_state() -> None:
    sealed = SealedState(9876543210123456789, 2499, True, 1700000100)
    assert sealed.to_json() == SEALED_JSON
    assert SealedState.from_json(SEALED_JSON, "k").broker_id == 9876543210123456789


def test_spec_5_4_policies() -> None:
    assert Policies().to_json() == POLICIES_JSON
    assert Policies.from_json(POLICIES_JSON, "/namespaces/default/policy") == Policies()


def test_policies_missing_fields_read_defaults() -> None:
    read = Policies.from_json(b'{"max_producers_per_topic":3}', "/namespaces/x/policy")
    assert read == Policies(max_producers_per_topic=3)
    assert read.max_message_size == 10485760


def test_cur_pointer() -> None:
    assert CurPointer.for_offset(1204).to_json() == b'{"start":"00000000000000001204"}'
    assert CurPointer.from_json(b'{"start":"00000000000000001204"}', "k").start == "00000000000000001204"


def test_unknown_fields_ignored() -> None:
    raw = SEALED_JSON[:-1] + b',"future":{"x":[1,2]}}'
    assert SealedState.from_json(raw, "k") == SealedState(9876543210123456789, 2499, True, 1700000100)


def test_missing_required_field_names_key_and_field() -> None:
    with pytest.raises(MetadataError, match=rf"{KEY}.*ObjectDescriptor.*'end_offset'"):
        ObjectDescriptor.from_json(DESCRIPTOR_JSON.replace(b'"end_offset":2499,', b""), KEY)


def test_missing_option_field_is_none() -> None:
    desc = ObjectDescriptor.from_json(DESCRIPTOR_JSON.replace(b'"etag":null,', b""), KEY)
    assert desc.etag is None


@pytest.mark.parametrize("bad", [b"2499.0", b"true", b'"2499"', b"-1", b"18446744073709551616"])
def test_u64_fields_reject_non_integers(bad: bytes) -> None:
    raw = DESCRIPTOR_JSON.replace(b'"end_offset":2499', b'"end_offset":' + bad)
    with pytest.raises(MetadataError, match=r"field 'end_offset' must be an integer"):
        ObjectDescriptor.from_json(raw, KEY)


def test_invalid_json_names_key() -> None:
    with pytest.raises(MetadataError, match="/cluster/leader"):
        load_json(b"{nope", "/cluster/leader")
    with pytest.raises(MetadataError, match="/k"):
        load_json(b"NaN", "/k")


def test_non_object_value_names_key() -> None:
    with pytest.raises(MetadataError, match="'/k'.*SealedState"):
        SealedState.from_json(b"[1]", "/k")


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_u64_exact_round_trip(n: int) -> None:
    sealed = SealedState(n, n, False, n)
    assert SealedState.from_json(sealed.to_json(), "k") == sealed
    assert parse_cursor(dump_cursor(n), "k") == n


def test_cursor_and_delivery_values() -> None:
    assert dump_cursor(1234) == b"1234"
    assert dump_delivery("Reliable") == b'"Reliable"'
    assert parse_delivery(b'"NonReliable"', "k") == "NonReliable"
    with pytest.raises(MetadataError, match="'k'"):
        parse_delivery(b'"Sometimes"', "k")
    with pytest.raises(MetadataError):
        parse_cursor(b"12.5", "k")
    assert parse_string(b'"orders"', "k") == "orders"


def test_broker_registration() -> None:
    reg = BrokerRegistration("http://h:50051", "http://h:6650", "http://h:6650")
    assert reg.to_json() == b'{"admin_addr":"http://h:50051","broker_url":"http://h:6650","connect_url":"http://h:6650"}'
    full = BrokerRegistration("a", "b", "c", "h:9040", "s3://bucket/wal")
    assert BrokerRegistration.from_json(full.to_json(), "k") == full


def test_broker_state() -> None:
    assert BrokerState("active", "boot").to_json() == b'{"mode":"active","reason":"boot"}'
    assert BrokerState.from_json(b'{"mode":"drained"}', "k") == BrokerState("drained")
    with pytest.raises(MetadataError, match="'mode'"):
        BrokerState.from_json(b'{"mode":"sleepy"}', "k")


def test_unassigned_markers() -> None:
    assert UnassignedMarker.from_json(b"null", "k").is_null
    assert UnassignedMarker().to_json() == b"null"
    assert UnassignedMarker(12, "unload").to_json() == b'{"from_broker":12,"reason":"unload"}'
    rebalance = b'{"from_broker":1,"reason":"rebalance","timestamp":5,"to_broker":2}'
    assert UnassignedMarker.from_json(rebalance, "k") == UnassignedMarker(1, "rebalance", 5, 2)
    assert UnassignedMarker(1, "rebalance", 5, 2).to_json() == rebalance


def test_producer_and_subscription_records() -> None:
    prod = ProducerRecord(0, 2**64 - 1, "p1", True, "/default/orders")
    assert prod.to_json() == (b'{"access_mode":0,"producer_id":18446744073709551615,"producer_name":"p1",'
                              b'"status":true,"topic_name":"/default/orders"}')
    assert ProducerRecord.from_json(prod.to_json(), "k") == prod
    sub = SubscriptionRecord(None, "c1", "s1", 1)
    assert sub.to_json() == b'{"consumer_id":null,"consumer_name":"c1","subscription_name":"s1","subscription_type":1}'
    assert SubscriptionRecord.from_json(sub.to_json(), "k") == sub


def test_schema_config() -> None:
    raw = b'{"enable_payload_validation":true,"subject":"orders","validation_policy":"Enforce"}'
    cfg = SchemaConfig.from_json(raw, "k")
    assert cfg == SchemaConfig(True, "orders", "Enforce") and cfg.to_json() == raw


def test_json_schema_fingerprint_ignores_formatting() -> None:
    a = json_schema_fingerprint('{"type": "object", "properties": {"id": {"type": "integer"}}}')
    b = json_schema_fingerprint('{"properties":{"id":{"type":"integer"}},"type":"object"}')
    assert a == b and a.startswith("sha256:") and len(a) == 7 + 64


def test_schema_version_json_schema() -> None:
    raw_schema = '{"type":"object"}'
    fp = json_schema_fingerprint(raw_schema)
    version = SchemaVersion(1, SchemaDef("JsonSchema", raw_schema, fp), fp, 1700000000, "admin")
    raw = version.to_json()
    assert b'"schema_def":{"JsonSchema":{"fingerprint":"' + fp.encode() + b'","raw_schema":' in raw
    assert SchemaVersion.from_json(raw, "/schemas/orders/versions/1") == version


@pytest.mark.parametrize("definition,encoded", [
    (SchemaDef("String"), b'"String"'),
    (SchemaDef("Avro", '{"type":"string"}', "sha256:00"),
     b'{"Avro":{"fingerprint":"sha256:00","raw_schema":"{\\"type\\":\\"string\\"}"}}'),
    (SchemaDef("Protobuf", "syntax = \"proto3\";", "sha256:11", "DefaultMessage"),
     b'{"Protobuf":{"fingerprint":"sha256:11","message_name":"DefaultMessage","raw_proto":"syntax = \\"proto3\\";"}}'),
])
def test_schema_def_variants(definition: SchemaDef, encoded: bytes) -> None:
    assert definition.to_json() == encoded
    assert SchemaDef.from_json(encoded, "k") == definition


def test_schema_def_unknown_variant() -> None:
    with pytest.raises(MetadataError, match="schema_def"):
        SchemaDef.from_json(b'{"Thrift":{}}', "k")


def test_schema_metadata_round_trip() -> None:
    version = SchemaVersion(1, SchemaDef("Bytes"), "bytes", 1, "me", tags=["a"])
    meta = SchemaMetadata(7, "orders", 1, 1, 2, "me", "Backward", ["/default/orders"], [version])
    assert SchemaMetadata.from_json(meta.to_json(), "/schemas/orders/metadata") == meta
    with pytest.raises(MetadataError, match="'/schemas/orders/metadata': SchemaVersion is missing required field 'version'"):
        SchemaMetadata.from_json(meta.to_json().replace(b'"version":1', b'"v":1'), "/schemas/orders/metadata")


def test_schema_index_and_compatibility() -> None:
    assert SchemaIndexEntry(5, "orders").to_json() == b'{"schema_id":5,"subject":"orders"}'
    assert SchemaCompatibility.from_json(b'{"mode":"full"}', "k").mode == "full"
    with pytest.raises(MetadataError):
        SchemaCompatibility.from_json(b'{"mode":"Full"}', "k")
