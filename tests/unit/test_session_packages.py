"""The jars a pipeline session asks for match the Spark that runs it."""

from __future__ import annotations

import re
from pathlib import Path

import pyspark
import pytest

from pipelines import session

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("version, avro", [("4.1.1", "4.1.1"), ("4.0.2", "4.0.2"), ("4.2.0", "4.2.0"), ("4.0.5", "4.0.2"),
                                           ("4.1.4", "4.1.1"), ("4.3.0", "4.2.0"), ("4.1.0", "4.0.2")])
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


def test_every_excluded_dependency_is_a_jar_spark_ships() -> None:
    """An exclusion of a jar Spark no longer ships would leave a class of Delta's missing."""
    jars = sorted(p.name for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar"))
    for coordinate in session.SPARK_PROVIDED:
        artifact = coordinate.split(":")[1]
        assert any(re.fullmatch(rf"{re.escape(artifact)}-\d[\w.-]*\.jar", name) for name in jars), coordinate


def test_package_settings_name_the_packages_and_the_exclusions() -> None:
    settings = session.package_settings("4.1.1")
    assert settings["spark.jars.packages"].split(",") == session.spark_packages("4.1.1")
    assert "org.apache.hadoop:hadoop-client-runtime" in settings["spark.jars.excludes"].split(",")
