"""Option parsing of the danube data source, without Spark: values, defaults, every bad value."""

from __future__ import annotations

import pickle

import pytest

from connectors import options as o
from danube_core.errors import ConfigError

BASE = {"etcd.endpoints": "127.0.0.1:2379", "storage.url": "s3://bucket/root", "topic": "/default/orders"}


def parse(**extra: str) -> o.DanubeOptions:
    return o.parse_options({**BASE, **extra})


def test_defaults() -> None:
    opts = o.parse_options(BASE)
    assert opts.etcd == o.EtcdSettings("127.0.0.1:2379", timeout_ms=o.DEFAULT_ETCD_TIMEOUT_MS)
    assert opts.root_prefix == "/danube-data"
    assert opts.wal_root == o.WAL_AUTO
    assert opts.topics == ("/default/orders",)
    assert opts.starting is None
    assert opts.starting_for(streaming=True) == o.Position("latest")
    assert opts.starting_for(streaming=False) == o.Position("earliest")
    assert opts.max_partition_bytes == 128 * 1024 * 1024
    assert opts.max_trigger_delay_ms == 15 * 60 * 1000
    assert opts.fail_on_data_loss is True
    assert opts.include_source is False
    assert opts.storage_options == {}


def test_keys_are_case_insensitive() -> None:
    opts = o.parse_options({
        "ETCD.Endpoints": "h1:1, h2:2", "Storage.URL": "file:///tmp/x", "TOPIC": "/a/b,/a/c,/a/b",
        "maxmessagespertrigger": "10", "FAILONDATALOSS": "False", "includesource": "TRUE",
    })
    assert opts.etcd.endpoints == "h1:1,h2:2"
    assert opts.topics == ("/a/b", "/a/c")
    assert opts.max_messages_per_trigger == 10
    assert opts.fail_on_data_loss is False
    assert opts.include_source is True


def test_storage_options_nest_dotted_keys_over_json() -> None:
    opts = parse(**{
        "storage.options": '{"key": "k", "client_kwargs": {"region_name": "eu"}, "config_kwargs": {"RetryMode": 3}}',
        "storage.client_kwargs.endpoint_url": "http://127.0.0.1:9000",
        "storage.anon": "false",
        "storage.secret": "s",
    })
    assert opts.storage_options == {
        "key": "k", "secret": "s", "anon": False,
        "client_kwargs": {"region_name": "eu", "endpoint_url": "http://127.0.0.1:9000"},
        "config_kwargs": {"RetryMode": 3},
    }
    assert "secret" not in repr(opts)


@pytest.mark.parametrize(
    "extra, expected",
    [
        ({"startingOffsets": "EARLIEST"}, o.Position("earliest")),
        ({"startingOffsets": "cursor"}, o.Position("cursor")),
        ({"startingOffsets": '{"/default/orders": 5}'}, o.Position("offsets", {"/default/orders": 5})),
        ({"startingOffsets": '{"/default/orders": -2}'}, o.Position("offsets", {"/default/orders": -2})),
        ({"startingTimestamp": "1700000000000"}, o.Position("timestamp", timestamp_ms=1700000000000)),
    ],
)
def test_starting_positions(extra: dict, expected: o.Position) -> None:
    assert parse(**extra).starting == expected


@pytest.mark.parametrize(
    "extra, expected",
    [
        ({"endingOffsets": "latest"}, o.Position("latest")),
        ({"endingOffsets": '{"/default/orders": 7}'}, o.Position("offsets", {"/default/orders": 7})),
        ({"endingOffsets": '{"/default/orders": -1}'}, o.Position("offsets", {"/default/orders": -1})),
        ({"endingTimestamp": "5"}, o.Position("timestamp", timestamp_ms=5)),
    ],
)
def test_ending_positions(extra: dict, expected: o.Position) -> None:
    assert parse(**extra).ending == expected


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("maxBytesPerTrigger", "1024", 1024),
        ("maxBytesPerTrigger", "64k", 64 << 10),
        ("maxBytesPerTrigger", "128MiB", 128 << 20),
        ("maxBytesPerTrigger", "1g", 1 << 30),
        ("maxBytesPerTrigger", "10b", 10),
        ("maxPartitionBytes", "2m", 2 << 20),
    ],
)
def test_sizes(key: str, value: str, expected: int) -> None:
    attr = {"maxBytesPerTrigger": "max_bytes_per_trigger", "maxPartitionBytes": "max_partition_bytes"}[key]
    assert getattr(parse(**{key: value}), attr) == expected


@pytest.mark.parametrize("value, ms", [("500ms", 500), ("250", 250), ("30s", 30_000), ("15m", 900_000), ("2h", 7_200_000)])
def test_trigger_delay(value: str, ms: int) -> None:
    assert parse(minMessagesPerTrigger="5", maxTriggerDelay=value).max_trigger_delay_ms == ms


@pytest.mark.parametrize(
    "key, value",
    [
        ("etcd.endpoints", ""),
        ("etcd.endpoints", "a:1,,b:2"),
        ("etcd.timeoutMs", "0"),
        ("etcd.timeoutMs", "fast"),
        ("rootPrefix", "danube-data"),
        ("walRoot", ""),
        ("topic", "orders"),
        ("topic", "/default/orders,/bad name/x"),
        ("startingOffsets", "newest"),
        ("startingOffsets", "{not json"),
        ("startingOffsets", '{"/default/orders": "5"}'),
        ("startingOffsets", '{"/default/orders": -3}'),
        ("startingOffsets", '{"orders": 1}'),
        ("startingOffsets", "[1, 2]"),
        ("startingTimestamp", "-5"),
        ("startingTimestamp", "yesterday"),
        ("endingOffsets", "earliest"),
        ("endingOffsets", '{"/default/orders": -2}'),
        ("endingTimestamp", "1.5"),
        ("maxMessagesPerTrigger", "0"),
        ("maxMessagesPerTrigger", "-1"),
        ("maxMessagesPerTrigger", "ten"),
        ("maxBytesPerTrigger", "12 parsecs"),
        ("maxBytesPerTrigger", "0"),
        ("minMessagesPerTrigger", "1.5"),
        ("maxPartitionBytes", "huge"),
        ("subscription", "a/b"),
        ("subscription", "has space"),
        ("failOnDataLoss", "yes"),
        ("failOnMissingTopic", "maybe"),
        ("includeSource", "1"),
        ("storage.options", "[1]"),
        ("storage.options", "{bad"),
    ],
)
def test_bad_value_names_option_and_value(key: str, value: str) -> None:
    with pytest.raises(ValueError) as info:
        parse(**{key: value})
    assert isinstance(info.value, ConfigError)
    assert key in str(info.value)
    assert repr(value) in str(info.value) or not value


def test_bad_trigger_delay_names_option() -> None:
    with pytest.raises(ValueError, match="'soon' for option 'maxTriggerDelay'.*duration"):
        parse(minMessagesPerTrigger="5", maxTriggerDelay="soon")


def test_bad_topic_pattern_names_option() -> None:
    opts = {k: v for k, v in BASE.items() if k != "topic"}
    with pytest.raises(ValueError, match=r"'\(unclosed' for option 'topicPattern'.*regular expression"):
        o.parse_options({**opts, "topicPattern": "(unclosed"})


def test_bad_namespace_names_option() -> None:
    opts = {k: v for k, v in BASE.items() if k != "topic"}
    with pytest.raises(ValueError, match="'a/b' for option 'namespace'"):
        o.parse_options({**opts, "namespace": "a/b"})


@pytest.mark.parametrize(
    "change, message",
    [
        ({"etcd.endpoints": None}, "'etcd.endpoints' is required"),
        ({"storage.url": None}, "'storage.url' is required"),
        ({"topic": None}, "exactly one of the options 'topic', 'topicPattern', 'namespace'"),
        ({"namespace": "default"}, "exactly one of the options"),
        ({"maxTriggerDelay": "5m"}, "'maxTriggerDelay' needs option 'minMessagesPerTrigger'"),
        ({"startingOffsets": "earliest", "startingTimestamp": "1"}, "exclude each other"),
        ({"endingOffsets": "latest", "endingTimestamp": "1"}, "exclude each other"),
        ({"etcd.user": "root"}, "option 'etcd.user': expected given together with etcd.password"),
        ({"etcd.certKey": "/k.pem"}, "option 'etcd.certKey': expected given together with etcd.certCert"),
        ({"maxOffsetsPerTirgger": "5"}, "unknown option 'maxOffsetsPerTirgger'"),
    ],
)
def test_bad_combinations(change: dict, message: str) -> None:
    raw = {**BASE, **change}
    raw = {k: v for k, v in raw.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        o.parse_options(raw)


def test_stream_needs_subscription_and_no_ending() -> None:
    with pytest.raises(ValueError, match="'subscription' is required for a streaming read"):
        parse().require_stream()
    with pytest.raises(ValueError, match="'endingOffsets'.*only valid for batch"):
        parse(subscription="s", endingOffsets="latest").require_stream()
    parse(subscription="s").require_stream()


def test_batch_refuses_trigger_limits_and_cursor_without_subscription() -> None:
    with pytest.raises(ValueError, match="'maxMessagesPerTrigger' is only valid for streaming"):
        parse(maxMessagesPerTrigger="5").require_batch()
    with pytest.raises(ValueError, match="'cursor' needs option 'subscription'"):
        parse(startingOffsets="cursor").require_batch()
    parse(startingOffsets="cursor", subscription="s").require_batch()


def test_lost_offsets_location_is_for_streams_only() -> None:
    assert parse(subscription="s", lostOffsetsLocation="/chk/lost").lost_offsets_location == "/chk/lost"
    with pytest.raises(ValueError, match="'lostOffsetsLocation' is only valid for streaming"):
        parse(lostOffsetsLocation="/chk/lost").require_batch()


def test_password_stays_out_of_repr_and_options_pickle() -> None:
    opts = parse(**{"etcd.user": "root", "etcd.password": "hunter2"})
    assert opts.etcd.password == "hunter2"
    assert "hunter2" not in repr(opts)
    assert pickle.loads(pickle.dumps(opts)) == opts


@pytest.mark.parametrize(
    "value, expected",
    [("AUTO", o.WAL_AUTO), ("none", o.WAL_NONE), ("file:///data/wal", "file:///data/wal"),
     ("/mnt/{broker_id}/wal", "/mnt/{broker_id}/wal")],
)
def test_wal_root(value: str, expected: str) -> None:
    assert parse(walRoot=value).wal_root == expected


def test_wal_root_map_of_broker_ids() -> None:
    value = '{"5951367860471965214": "file:///data/wal-b", "7": "http://host:7700/"}'
    assert parse(walRoot=value).wal_root == value
    from connectors.wal_root import parse_wal_map

    assert parse_wal_map(value) == {5951367860471965214: "file:///data/wal-b", 7: "http://host:7700/"}


@pytest.mark.parametrize("value, words", [
    ('{"b1": "file:///x"}', "key 'b1' is not a broker id"),
    ('{"7": ""}', "broker 7 maps to ''"),
    ('{"7": 3}', "broker 7 maps to 3"),
    ("{}", "JSON object"),
    ('{"7": "file:///x"', "walRoot"),
])
def test_bad_wal_root_map_names_option_and_entry(value: str, words: str) -> None:
    with pytest.raises(ConfigError, match="walRoot") as info:
        parse(walRoot=value)
    assert words in str(info.value)


def test_salvage_reads_named_sources_of_one_topic_with_provenance() -> None:
    opts = parse(salvage="data-0-1795442995.dnb1, file:///w/default/t/wal.log#0")
    assert opts.salvage == ("data-0-1795442995.dnb1", "file:///w/default/t/wal.log#0")
    assert opts.include_source is True
    opts.require_batch()
    with pytest.raises(ConfigError, match="only valid for batch reads"):
        parse(salvage="data-0-1.dnb1", subscription="s").require_stream()


@pytest.mark.parametrize("extra, words", [
    ({"salvage": "data-x.dnb1"}, "invalid value 'data-x.dnb1' for option 'salvage'"),
    ({"salvage": " , "}, "for option 'salvage'"),
    ({"salvage": "data-0-1.dnb1", "topic": "/default/a,/default/b"}, "exactly one topic"),
    ({"salvage": "data-0-1.dnb1", "startingOffsets": "earliest"}, "excludes 'startingOffsets'"),
])
def test_bad_salvage_names_option(extra: dict, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        o.parse_options({**BASE, **extra})
    assert words in str(info.value)


def test_kafka_trigger_limits_are_accepted_under_their_kafka_names() -> None:
    opts = parse(maxOffsetsPerTrigger="1000", minOffsetsPerTrigger="10", maxTriggerDelay="5s")
    assert (opts.max_messages_per_trigger, opts.min_messages_per_trigger) == (1000, 10)
    assert parse(maxOffsetsPerTrigger="5", maxMessagesPerTrigger="7").max_messages_per_trigger == 7
    with pytest.raises(ConfigError, match="maxMessagesPerTrigger"):
        parse(maxOffsetsPerTrigger="0")


@pytest.mark.parametrize("key, words", [
    ("subscribe", "use 'topic'"), ("subscribePattern", "use 'topicPattern'"),
    ("includeHeaders", "attributes"), ("minPartitions", "maxPartitionBytes"),
    ("kafka.bootstrap.servers", "etcd.endpoints"), ("groupIdPrefix", "subscription"),
])
def test_kafka_source_options_say_what_to_use_instead(key: str, words: str) -> None:
    with pytest.raises(ConfigError, match=f"Kafka source option '{key}'") as info:
        parse(**{key: "x"})
    assert words in str(info.value)


@pytest.mark.parametrize("key", ["kafka.security.protocol", "kafka.sasl.jaas.config", "Kafka.Client.Id"])
def test_kafka_consumer_properties_say_there_is_no_consumer(key: str) -> None:
    with pytest.raises(ConfigError, match=f"option '{key}' is a Kafka consumer property") as info:
        parse(**{key: "x"})
    assert "'etcd.endpoints'" in str(info.value) and "'storage.url'" in str(info.value)


def test_kafka_nested_per_partition_offsets() -> None:
    opts = parse(startingOffsets='{"/default/orders": {"0": 12, "1": -2}}')
    assert opts.starting.offsets == {"/default/orders-part-0": 12, "/default/orders-part-1": -2}
    ending = parse(endingOffsets='{"/default/orders": {"2": 40}}').ending
    assert ending.offsets == {"/default/orders-part-2": 40}
    for bad in ('{"/default/orders": {"x": 1}}', '{"/default/orders": {"0": "1"}}', '{"/default/orders": {"0": -3}}'):
        with pytest.raises(ConfigError, match="startingOffsets"):
            parse(startingOffsets=bad)
