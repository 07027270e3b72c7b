"""Malformed options fail before any data is read, with our message as the first thing the user sees.

Every value check is covered without Spark in tests/unit/test_options.py; these check what
Spark shows: the first line of the error is Spark's error class followed by the
`ConfigError` naming the option, with no Python traceback in front of it and no PySpark
`UnboundLocalError` in its place (`connectors.plain_errors`).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.spark

BASE = {"etcd.endpoints": "127.0.0.1:1", "storage.url": "file:///nonexistent", "topic": "/default/t"}


def first_line(error: BaseException) -> str:
    """What a user sees first: the first line of the exception's message."""
    return str(error).splitlines()[0]


def assert_plain(error: BaseException, message: str) -> None:
    """`message` is on the first line, as a ConfigError, and no traceback precedes it."""
    text = str(error)
    assert f"danube_core.errors.ConfigError: {message}" in first_line(error), text
    assert "Traceback" not in text and "UnboundLocalError" not in text, text


def load_error(spark, options: dict[str, str], streaming: bool) -> BaseException:
    reader = spark.readStream if streaming else spark.read
    with pytest.raises(Exception) as info:
        reader.format("danube").options(**options).load()
    return info.value


def start_error(spark, options: dict[str, str], tmp_path) -> BaseException:
    """A stream that passes `load()` but must not read: the error it terminates with."""
    df = spark.readStream.format("danube").options(**options).load()
    query = df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "chk")).start()
    with pytest.raises(Exception) as info:
        query.awaitTermination(120)
    assert query.recentProgress == []  # no batch ran
    return info.value


@pytest.mark.parametrize(
    "key, value, accepted",
    [
        ("startingOffsets", "newest", "expected 'earliest', 'latest', 'cursor'"),
        ("maxMessagesPerTrigger", "0", "expected an integer >= 1"),
        ("maxOffsetsPerTrigger", "-5", "expected an integer >= 1"),
        ("maxBytesPerTrigger", "12 parsecs", "expected a number of bytes"),
        ("failOnDataLoss", "maybe", "expected true or false"),
        ("topic", "no-namespace", "expected the form /{namespace}/{topic}"),
        ("rootPrefix", "danube-data", "expected an etcd key prefix starting with '/'"),
    ],
)
@pytest.mark.parametrize("streaming", [False, True])
def test_bad_value_fails_load_with_its_message_first(spark, key: str, value: str, accepted: str,
                                                     streaming: bool) -> None:
    error = load_error(spark, {**BASE, key: value}, streaming)
    line = first_line(error)
    assert line.startswith("[PYTHON_DATA_SOURCE_ERROR]"), line
    assert "danube_core.errors.ConfigError: " in line and repr(value) in line and accepted in line, line
    shown = "maxMessagesPerTrigger" if key == "maxOffsetsPerTrigger" else key  # the Kafka alias
    assert repr(shown) in line, line
    assert "Traceback" not in str(error)


@pytest.mark.parametrize("streaming", [False, True])
def test_unknown_option_fails_load_naming_it(spark, streaming: bool) -> None:
    error = load_error(spark, {**BASE, "maxOffsetsPerTirgger": "5"}, streaming)
    # Spark lower-cases option keys before a data source sees them
    assert_plain(error, "unknown option 'maxoffsetspertirgger' for the danube data source; accepted: ")


@pytest.mark.parametrize(
    "key, instead",
    [
        ("subscribe", "use 'topic'"),
        ("includeHeaders", "Danube attributes are always read, in the column `attributes`"),
        ("minPartitions", "set 'maxPartitionBytes'"),
        ("kafka.bootstrap.servers", "use 'etcd.endpoints' and 'storage.url'"),
    ],
)
def test_kafka_option_fails_load_saying_what_to_use(spark, key: str, instead: str) -> None:
    error = load_error(spark, {**BASE, key: "x"}, streaming=True)
    assert_plain(error, f"Kafka source option {key!r} is not a danube option; for the danube data source {instead}")


def test_kafka_consumer_property_fails_load(spark) -> None:
    error = load_error(spark, {**BASE, "kafka.security.protocol": "SSL"}, streaming=False)
    assert_plain(error, "option 'kafka.security.protocol' is a Kafka consumer property")


def test_missing_required_option_fails_load(spark) -> None:
    error = load_error(spark, {"storage.url": "file:///nonexistent", "topic": "/default/t"}, streaming=True)
    assert_plain(error, "option 'etcd.endpoints' is required")


def test_stream_without_subscription_fails_as_it_starts(spark, tmp_path) -> None:
    # regression: PySpark's UnboundLocalError hid the ConfigError (reader.stop() in a finally)
    error = start_error(spark, BASE, tmp_path)
    assert_plain(error, "option 'subscription' is required for a streaming read")
    assert first_line(error).startswith("[STREAM_FAILED]")


def test_batch_only_option_on_a_stream_fails_as_it_starts(spark, tmp_path) -> None:
    error = start_error(spark, {**BASE, "subscription": "s", "endingOffsets": "latest"}, tmp_path)
    assert_plain(error, "options 'endingOffsets' and 'endingTimestamp' are only valid for batch reads")


def test_stream_only_option_on_a_batch_fails_at_first_action(spark) -> None:
    df = spark.read.format("danube").options(**BASE).option("maxMessagesPerTrigger", "5").load()
    with pytest.raises(Exception) as info:
        df.collect()
    assert_plain(info.value, "option 'maxMessagesPerTrigger' is only valid for streaming reads")
