"""The SparkSession a pipeline runs in: Delta Lake, Spark's Avro functions, the `danube` source.

What spark-submit `--conf`, `spark-defaults.conf` or a cluster sets is kept: the small-machine
defaults below are applied only to settings nothing else has set, and a session that already
exists (a notebook's, a Databricks cluster's) is used as it is, with only the pipeline file's own
`spark_conf` applied.

Maven coordinates: Delta publishes one jar per Spark minor
(`io.delta:delta-spark_<spark major.minor>_2.13:<delta version>`); `DELTA_FOR_SPARK` names the
Delta release each Spark minor runs with (4.4.0 for Spark 4.0, 4.1 and 4.2: Maven Central has
no Delta built for Spark 4.3 yet). A pipeline on a Spark with no Delta release, or with an
installed delta-spark that does not fit it, fails at start naming both versions
(`require_delta_pair`), instead of failing later on a class Delta cannot load. spark-avro is built per Spark release and must be the running Spark's
version (`avro_package`); Maven Central has no spark-avro for a few releases (4.2.0), for
which the newest earlier release is used, with a warning. The coordinates live here only:
`spark-submit.sh` asks `spark_packages()` and `SPARK_PROVIDED` for them.

Delta's jar depends on jars Spark ships itself, in other versions (`SPARK_PROVIDED`: the Hadoop
client, Parquet, Jackson, log4j and others). Spark's own copies come first on the driver's and
the executors' classpath, so Delta's copies were never the ones loaded, yet every driver
resolved them and copied them (about 75 MB) into its work directory as it started, and every
executor of a cluster fetched them. Those the running Spark ships are excluded
(`spark.jars.excludes`, `spark_provided()`): Spark 4.0 has no jts-core, so Delta's is kept there.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path
from typing import Mapping

from pyspark.sql import SparkSession

from danube_core.errors import ConfigError

logger = logging.getLogger(__name__)

SCALA_BINARY = "2.13"
# Spark major.minor -> the Delta release whose jar for it the pipelines load; the same pairs
# are pinned in constraints.txt and run by tests/integration/test_spark_versions.py.
DELTA_FOR_SPARK = {"4.0": "4.4.0", "4.1": "4.4.0", "4.2": "4.4.0"}
# The spark-avro releases Maven Central has for Spark 4 (it has none for several Spark releases:
# 4.0.3-4.0.5, 4.1.0, 4.1.2-4.1.4); a Spark gets the newest of these at or below its own version
# (`from_avro`/`to_avro` are checked by the Avro pipeline test and on each Spark line).
AVRO_PUBLISHED = ("4.0.0", "4.0.1", "4.0.2", "4.1.1", "4.2.0")

# Delta 4.4's dependencies that Spark ships in its own jars (group:artifact, the form of
# `spark.jars.excludes`); `spark_provided()` keeps those the running Spark has.
SPARK_PROVIDED = (
    "com.fasterxml.jackson.core:jackson-annotations",
    "com.fasterxml.jackson.core:jackson-core",
    "com.fasterxml.jackson.core:jackson-databind",
    "com.github.luben:zstd-jni",
    "com.google.code.findbugs:jsr305",
    "commons-pool:commons-pool",
    "io.airlift:aircompressor",
    "org.apache.hadoop:hadoop-client-api",
    "org.apache.hadoop:hadoop-client-runtime",
    "org.apache.logging.log4j:log4j-api",
    "org.apache.logging.log4j:log4j-core",
    "org.apache.logging.log4j:log4j-slf4j2-impl",
    "org.apache.parquet:parquet-column",
    "org.apache.parquet:parquet-common",
    "org.apache.parquet:parquet-encoding",
    "org.apache.parquet:parquet-format-structures",
    "org.apache.parquet:parquet-hadoop",
    "org.apache.parquet:parquet-jackson",
    "org.locationtech.jts:jts-core",
    "org.roaringbitmap:RoaringBitmap",
    "org.scala-lang.modules:scala-parallel-collections_2.13",
    "org.slf4j:slf4j-api",
    "org.tukaani:xz",
    "org.xerial.snappy:snappy-java",
)

# Small-machine defaults, for settings nothing else has set: Spark's 200 shuffle partitions
# cost seconds per micro-batch on 2 cores. Runtime SQL settings, so they can still be applied
# once the session exists and its own configuration is known.
RUNTIME_DEFAULTS = {
    "spark.sql.shuffle.partitions": "4",
    "spark.databricks.delta.snapshotPartitions": "2",
}
# Only when this process launches Spark itself (`python -m pipelines run`).
LAUNCH_DEFAULTS = {"spark.ui.showConsoleProgress": "false"}
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def running_spark_version() -> str:
    """The version of the Spark that `spark-submit` (or this process) runs: `$SPARK_HOME`'s
    when it is set (a cluster's own Spark), else the installed pyspark's."""
    home = os.environ.get("SPARK_HOME")
    if home:
        for jar in (Path(home) / "jars").glob(f"spark-core_{SCALA_BINARY}-*.jar"):
            return jar.name[len(f"spark-core_{SCALA_BINARY}-"):-len(".jar")]
    import pyspark

    return pyspark.__version__


def running_spark_jars() -> Path:
    """The jars directory of the Spark `running_spark_version` names."""
    home = os.environ.get("SPARK_HOME")
    if home:
        return Path(home) / "jars"
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def delta_package(spark_version: str) -> str:
    """Delta's Maven coordinates for `spark_version`; ConfigError where no Delta release fits."""
    require_delta_pair(spark_version, installed_delta=None)
    minor = _minor(spark_version)
    return f"io.delta:delta-spark_{minor}_{SCALA_BINARY}:{DELTA_FOR_SPARK[minor]}"


def require_delta_pair(spark_version: str, installed_delta: str | None) -> None:
    """Fail, naming both versions, where no Delta release runs on `spark_version`, or where the
    installed delta-spark (its Python API; None: not checked) is not the release that does."""
    minor = _minor(spark_version)
    wanted = DELTA_FOR_SPARK.get(minor)
    if wanted is None:
        supported = ", ".join(sorted(DELTA_FOR_SPARK))
        found = f" (delta-spark {installed_delta} is installed)" if installed_delta else ""
        raise ConfigError(
            f"no Delta Lake release runs on Spark {spark_version}{found}: the pipelines write Delta "
            f"tables with delta-spark {max(DELTA_FOR_SPARK.values())} on Spark {supported}; run the "
            f"pipeline on one of those (the `danube` source itself reads on Spark {spark_version})")
    if installed_delta is not None and _minor(installed_delta) != _minor(wanted):
        raise ConfigError(
            f"delta-spark {installed_delta} is installed but Spark {spark_version} runs with Delta "
            f"{wanted}: pip install 'delta-spark=={wanted}' (constraints.txt)")


def installed_delta_version() -> str | None:
    """The installed delta-spark package's version, or None (a runtime that brings its own)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("delta-spark")
    except PackageNotFoundError:
        return None


def spark_provided(jars: Path | None = None) -> list[str]:
    """`SPARK_PROVIDED` less what the running Spark (`jars`) does not ship."""
    names = [p.name for p in (jars or running_spark_jars()).glob("*.jar")]
    return [c for c in SPARK_PROVIDED
            if any(re.fullmatch(rf"{re.escape(c.split(':')[1])}-\d[\w.-]*\.jar", n) for n in names)]


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def avro_package(spark_version: str) -> str:
    """spark-avro's Maven coordinates for `spark_version` (see `AVRO_PUBLISHED`)."""
    running = _release(spark_version)
    version = max((v for v in AVRO_PUBLISHED if _release(v) <= running), key=_release, default=AVRO_PUBLISHED[0])
    if version != spark_version:
        logger.info("no spark-avro %s on Maven Central; using %s", spark_version, version)
    return f"org.apache.spark:spark-avro_{SCALA_BINARY}:{version}"


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def spark_packages(spark_version: str | None = None) -> list[str]:
    """Maven coordinates a pipeline needs on the classpath (Delta, spark-avro)."""
    version = spark_version or running_spark_version()
    return [delta_package(version), avro_package(version)]


def package_settings(spark_version: str | None = None) -> dict[str, str]:
    """The Spark settings that put a pipeline's packages on the classpath, for a session this
    process launches (spark-submit takes the same as `--packages` and `--exclude-packages`)."""
    return {"spark.jars.packages": ",".join(spark_packages(spark_version)),
            "spark.jars.excludes": ",".join(spark_provided())}


def build_session(app_name: str, conf: Mapping[str, str] | None = None, master: str | None = None) -> SparkSession:
    """Get or create the session for a pipeline and register the `danube` data source.

    `conf` (the pipeline file's `spark_conf`) is applied as given. Under `spark-submit` the
    packages, master and `--conf` settings come from the submit command; run directly
    (`python -m pipelines run`) the session asks Spark to fetch the packages itself and runs
    on `local[*]` unless `master` or `spark.master` in `conf` says otherwise. An existing
    session is returned with only `conf` applied.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    existing = SparkSession.getActiveSession()
    builder = SparkSession.builder.appName(app_name)
    settings = dict(conf or {})
    if existing is None:
        require_delta_pair(running_spark_version(), installed_delta_version())
        settings = {**DELTA_CONF, **settings}
        if not _under_spark_submit():
            settings = {**LAUNCH_DEFAULTS, **settings}
            for key, value in package_settings().items():
                settings.setdefault(key, value)
            builder = builder.master(master or settings.pop("spark.master", "local[*]"))
        elif master is not None:
            builder = builder.master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if existing is None:
        apply_runtime_defaults(spark)
    register_danube(spark)
    logger.info("spark %s session %s ready (master %s, spark.sql.shuffle.partitions=%s)", spark.version,
                app_name, spark.sparkContext.master, spark.conf.get("spark.sql.shuffle.partitions"))
    return spark


def apply_runtime_defaults(spark: SparkSession) -> dict[str, str]:
    """Set each of `RUNTIME_DEFAULTS` that the session's configuration (spark-submit `--conf`,
    `spark-defaults.conf`, the builder) does not name. Returns what was set."""
    given = spark.sparkContext.getConf()
    applied = {key: value for key, value in RUNTIME_DEFAULTS.items() if not given.contains(key)}
    for key, value in applied.items():
        spark.conf.set(key, value)
    return applied


def register_danube(spark: SparkSession) -> None:
    """Make `format("danube")` available (and its cursor-committing listener installed)."""
    import connectors

    connectors.register(spark)


def _under_spark_submit() -> bool:
    """spark-submit starts the JVM first and hands Python its gateway port."""
    return "PYSPARK_GATEWAY_PORT" in os.environ
