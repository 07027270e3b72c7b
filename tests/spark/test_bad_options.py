"""Malformed options fail before any data is read, with a ValueError naming the option.

Every value check is covered without Spark in tests/unit/test_options.py; these check that
Spark surfaces them at `load()` (batch and stream) and that stream-only checks stop a query
at its first step.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.spark

BASE = {"etcd.endpoints": "127.0.0.1:1", "storage.url": "file:///nonexistent", "topic": "/default/t"}


@pytest.mark.parametrize(
    "key, value",
    [
        ("startingOffsets", "newest"),
        ("maxMessagesPerTrigger", "0"),
        ("maxBytesPerTrigger", "12 parsecs"),
        ("failOnDataLoss", "maybe"),
        ("topic", "no-namespace"),
        ("rootPrefix", "danube-data"),
    ],
)
@pytest.mark.parametrize("streaming", [False, True])
def test_bad_value_fails_load(spark, key: str, value: str, streaming: bool) -> None:
    reader = spark.readStream if streaming else spark.read
    with pytest.raises(Exception) as info:
        reader.format("danube").options(**BASE).option(key, value).load()
    text = str(info.value)
    assert "ValueError" in text or "ConfigError" in text
    assert f"option {key!r}" in text and repr(value) in text


def test_unknown_option_fails_load(spark) -> None:
    with pytest.raises(Exception, match="unknown option 'maxoffsetspertirgger'"):
        spark.read.format("danube").options(**BASE).option("maxOffsetsPerTirgger", "5").load()
    with pytest.raises(Exception, match="Kafka source option 'subscribe'.*use 'topic'"):
        spark.read.format("danube").options(**BASE).option("subscribe", "orders").load()


def test_stream_without_subscription_fails_before_reading(spark, tmp_path) -> None:
    df = spark.readStream.format("danube").options(**BASE).load()
    query = df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "chk")).start()
    with pytest.raises(Exception, match="'subscription' is required for a streaming read"):
        query.awaitTermination(60)
    assert query.recentProgress == []
