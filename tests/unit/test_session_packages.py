"""The jars a pipeline session asks for match the Spark that runs it."""

from __future__ import annotations

import pyspark
import pytest

from pipelines import session

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("version, avro", [("4.1.1", "4.1.1"), ("4.0.2", "4.0.2"), ("4.2.0", "4.1.1")])
def test_avro_jar_is_the_running_sparks_release(version: str, avro: str) -> None:
    assert session.avro_package(version) == f"org.apache.spark:spark-avro_2.13:{avro}"


def test_running_spark_version_is_spark_homes_when_set(tmp_path, monkeypatch) -> None:
    (tmp_path / "jars").mkdir()
    (tmp_path / "jars" / "spark-core_2.13-4.0.1.jar").write_bytes(b"")
    monkeypatch.setenv("SPARK_HOME", str(tmp_path))
    assert session.running_spark_version() == "4.0.1"
    assert session.spark_packages()[1] == "org.apache.spark:spark-avro_2.13:4.0.1"


def test_running_spark_version_is_pyspark_without_spark_home(monkeypatch) -> None:
    monkeypatch.delenv("SPARK_HOME", raising=False)
    assert session.running_spark_version() == pyspark.__version__
