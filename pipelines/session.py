"""The SparkSession a pipeline runs in: Delta Lake, Spark's Avro functions, the `danube` source.

Maven coordinates: delta-spark's `configure_spark_with_delta_pip` derives the jar from the pip
package's own version (`io.delta:delta-spark_<spark major.minor>_2.13:<delta version>`), which
for the pinned delta-spark 4.4.1 names `io.delta:delta-spark_4.2_2.13:4.4.1`, a jar Maven
Central does not serve; the newest Delta jar published for Spark 4.2 is 4.4.0, whose Python
API is the same. Likewise pyspark 4.2 has no `spark-avro` 4.2 jar on Maven Central; the 4.1.1
jar provides `from_avro`/`to_avro` on 4.2 (checked by the Avro pipeline test). Both
coordinates live here only: `spark-submit.sh` asks `spark_packages()` for them.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Mapping

from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

SCALA_BINARY = "2.13"
DELTA_PACKAGE = f"io.delta:delta-spark_4.2_{SCALA_BINARY}:4.4.0"
AVRO_PACKAGE = f"org.apache.spark:spark-avro_{SCALA_BINARY}:4.1.1"

# Small-machine defaults: Spark's 200 shuffle partitions cost seconds per micro-batch on 2 cores.
LOCAL_DEFAULTS = {
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.ui.showConsoleProgress": "false",
}
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def spark_packages() -> list[str]:
    """Maven coordinates a pipeline needs on the classpath (Delta, spark-avro)."""
    return [DELTA_PACKAGE, AVRO_PACKAGE]


def build_session(app_name: str, conf: Mapping[str, str] | None = None, master: str | None = None) -> SparkSession:
    """Get or create the session for a pipeline and register the `danube` data source.

    Under `spark-submit` the packages and master come from the submit command; run directly
    (`python -m pipelines run`) the session asks Spark to fetch the packages itself and runs
    on `local[*]` unless `master` or `spark.master` in `conf` says otherwise.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    settings = {**LOCAL_DEFAULTS, **DELTA_CONF, **(conf or {})}
    if not _under_spark_submit():
        settings.setdefault("spark.jars.packages", ",".join(spark_packages()))
        builder = builder.master(master or settings.pop("spark.master", "local[*]"))
    elif master is not None:
        builder = builder.master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register_danube(spark)
    logger.info("spark %s session %s ready (master %s)", spark.version, app_name, spark.sparkContext.master)
    return spark


def register_danube(spark: SparkSession) -> None:
    """Make `format("danube")` available (and its cursor-committing listener installed)."""
    import connectors

    connectors.register(spark)


def _under_spark_submit() -> bool:
    """spark-submit starts the JVM first and hands Python its gateway port."""
    return "PYSPARK_GATEWAY_PORT" in os.environ
