"""The connector on Spark lines other than the suite's: what each offers, what is refused by name.

The Spark 4.0/4.1 behaviour is exercised end to end in those Sparks by
tests/integration/test_spark_versions.py; here, the decisions themselves, on the suite's Spark
with the admission-control switch turned off where a test needs an older line's view.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

import connectors
from connectors import spark_compat, stream
from connectors.plain_errors import FailedStreamReader
from connectors.source import DanubeDataSource
from danube_core.errors import ConfigError
from pipelines import session

pytestmark = pytest.mark.unit

BASE = {"etcd.endpoints": "127.0.0.1:1", "storage.url": "file:///x", "topic": "/default/t",
        "subscription": "s"}


@pytest.mark.parametrize("version", ["4.0.0", "4.0.5", "4.1.4", "4.2.0", "4.3.0", "4.9.1.dev2"])
def test_spark_4_is_supported(version: str) -> None:
    assert spark_compat.unsupported_spark(version) is None


@pytest.mark.parametrize("version", ["3.5.1", "3.5.0", "2.4.8", "5.0.0"])
def test_other_sparks_are_named_with_the_range_needed(version: str) -> None:
    reason = spark_compat.unsupported_spark(version)
    assert reason is not None and f"this is Spark {version}" in reason and "Spark 4.0 to 4.x" in reason


def test_an_unreadable_version_is_named() -> None:
    with pytest.raises(ConfigError, match="cannot read the Spark version 'nightly'"):
        spark_compat.spark_version_tuple("nightly")


def test_register_names_an_old_spark_before_touching_the_session() -> None:
    class OldSpark:
        version = "3.5.1"

        def __getattr__(self, name: str) -> object:
            raise AssertionError(f"register used spark.{name} on an unsupported Spark")

    with pytest.raises(ConfigError, match=r"needs Spark 4\.0 to 4\.x .* this is Spark 3\.5\.1"):
        connectors.register(OldSpark())


def test_the_arrow_schema_has_utc_timestamps() -> None:
    from connectors.schema import SPARK_SCHEMA

    schema = spark_compat.arrow_schema_of(SPARK_SCHEMA)
    (timestamp,) = [f for f in schema if pa.types.is_timestamp(f.type)]
    assert timestamp.type == pa.timestamp("us", tz="UTC")


@pytest.mark.parametrize("option, value", [("maxMessagesPerTrigger", "10"), ("maxOffsetsPerTrigger", "10"),
                                           ("maxBytesPerTrigger", "1m"), ("minMessagesPerTrigger", "5"),
                                           ("minOffsetsPerTrigger", "5")])
def test_a_trigger_limit_is_refused_where_spark_cannot_honour_it(monkeypatch, option: str, value: str) -> None:
    monkeypatch.setattr(stream, "ADMISSION_CONTROL", False)
    monkeypatch.setattr(spark_compat, "SPARK_VERSION", "4.0.5")
    reader = DanubeDataSource({**BASE, option: value}).streamReader(None)
    assert isinstance(reader, FailedStreamReader)
    with pytest.raises(ConfigError) as raised:
        reader.latestOffset()  # how Spark 4.0/4.1 call it: no start, no limit
    message = str(raised.value)
    canonical = option.replace("Offsets", "Messages")
    assert f"option {canonical!r}" in message and "this is Spark 4.0.5" in message
    assert "needs Spark 4.2 or later" in message


def test_without_limits_an_older_spark_gets_a_stream(monkeypatch) -> None:
    monkeypatch.setattr(stream, "ADMISSION_CONTROL", False)
    reader = DanubeDataSource(dict(BASE)).streamReader(None)
    assert isinstance(reader, stream.DanubeStreamReader)


def test_limits_are_admitted_with_admission_control() -> None:
    reader = DanubeDataSource({**BASE, "maxMessagesPerTrigger": "10"}).streamReader(None)
    assert isinstance(reader, stream.DanubeStreamReader)


# ---- pipelines: Spark and Delta pairs --------------------------------------------------------


@pytest.mark.parametrize("spark", ["4.0.5", "4.1.4", "4.2.0"])
def test_each_spark_with_a_delta_release_gets_its_own_jar(spark: str) -> None:
    minor = ".".join(spark.split(".")[:2])
    assert session.delta_package(spark) == f"io.delta:delta-spark_{minor}_2.13:4.4.0"
    session.require_delta_pair(spark, "4.4.0")


def test_a_spark_without_delta_is_named_with_the_delta_that_exists() -> None:
    with pytest.raises(ConfigError) as raised:
        session.delta_package("4.3.0")
    message = str(raised.value)
    assert "no Delta Lake release runs on Spark 4.3.0" in message
    assert "delta-spark 4.4.0 on Spark 4.0, 4.1, 4.2" in message
    with pytest.raises(ConfigError, match=r"Spark 4\.3\.0 \(delta-spark 4\.4\.0 is installed\)"):
        session.require_delta_pair("4.3.0", "4.4.0")


def test_a_mismatched_delta_spark_package_is_named() -> None:
    with pytest.raises(ConfigError, match=r"delta-spark 4\.0\.1 is installed but Spark 4\.0\.5 runs with Delta 4\.4\.0"):
        session.require_delta_pair("4.0.5", "4.0.1")


def test_only_jars_the_running_spark_ships_are_excluded(tmp_path: Path) -> None:
    for jar in ("jackson-core-2.18.2.jar", "hadoop-client-runtime-3.4.1.jar", "spark-core_2.13-4.0.5.jar"):
        (tmp_path / jar).write_bytes(b"")
    assert session.spark_provided(tmp_path) == ["com.fasterxml.jackson.core:jackson-core",
                                                "org.apache.hadoop:hadoop-client-runtime"]


@pytest.mark.parametrize("spark, refused", [("4.0.5", True), ("4.1.4", True), ("4.2.0", False), ("4.3.0", False)])
def test_a_pipelines_batch_cap_is_refused_by_key_where_spark_cannot_honour_it(tmp_path: Path, spark: str,
                                                                               refused: bool) -> None:
    from devstack.demo import PIPELINE_FILE
    from pipelines.config import load_config
    from pipelines.runner import check_trigger_limits

    config = load_config(PIPELINE_FILE, env={})
    assert config.source.max_messages_per_trigger is not None  # the shipped file caps its batches
    if not refused:
        check_trigger_limits(config, spark)
        return
    with pytest.raises(ConfigError) as raised:
        check_trigger_limits(config, spark)
    message = str(raised.value)
    assert message.startswith(f"{PIPELINE_FILE}: source.max_messages_per_trigger needs Spark 4.2 or later")
    assert f"this is Spark {spark}" in message
