"""Spark's JDBC reader against a gateway, for tests/speedlayer/test_flight_sql_jdbc.py.

python spark_jdbc_reads.py <jars> <jdbc url> <user> <password> <reads JSON> <JVM time zone>

`jars`: the driver's jar, and the dialect's (comma-separated) as a user puts them on spark.jars.
`reads` maps a name to the reader's options (`dbtable` or `query`, partitioning, ...); a read
whose options hold `"without_dialect": "true"` runs with the dialect Spark chose for the URL
unregistered (what Spark does without the dialect's jar). One local Spark session (the jars on
spark.jars, its JVMs in the given zone, its session in UTC) runs each read and prints one JSON
line per read: its name and the dialect Spark used, then either the schema, the number of
partitions and the rows sorted by their first column (timestamps as ISO text, in UTC), or the
Java exception's first line.
"""

from __future__ import annotations

import json
import sys


def main(jar: str, url: str, user: str, password: str, reads: dict[str, dict[str, str]], zone: str) -> None:
    from pyspark.sql import SparkSession

    jvm_zone = f"-Duser.timezone={zone}"
    spark = (SparkSession.builder.master("local[2]").appName("flight-sql-jdbc")
             .config("spark.jars", jar).config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.sql.session.timeZone", "UTC")
             .config("spark.driver.extraJavaOptions", jvm_zone).config("spark.executor.extraJavaOptions", jvm_zone)
             .getOrCreate())
    try:
        dialects = spark.sparkContext._jvm.org.apache.spark.sql.jdbc.JdbcDialects  # type: ignore[union-attr]
        for name, options in reads.items():
            options = dict(options)
            without = options.pop("without_dialect", "") == "true"
            dialect = dialects.get(url)
            if without:
                dialects.unregisterDialect(dialect)
            reader = (spark.read.format("jdbc").option("url", url).option("user", user)
                      .option("password", password).option("driver", "org.apache.arrow.driver.jdbc.ArrowFlightJdbcDriver"))
            try:
                frame = reader.options(**options).load()
                rows = sorted(frame.collect(), key=lambda row: row[0])
                print(json.dumps({"read": name, "dialect": dialects.get(url).getClass().getName(),
                                  "schema": frame.schema.simpleString(), "partitions": frame.rdd.getNumPartitions(),
                                  "rows": [[_text(v) for v in row] for row in rows]}))
            except Exception as exc:  # the reader's refusal is what the test reads
                cause = getattr(exc, "java_exception", None)
                text = cause.toString() if cause is not None else str(exc)
                print(json.dumps({"read": name, "dialect": dialects.get(url).getClass().getName(),
                                  "error": text.strip().splitlines()[0]}))
            finally:
                if without:
                    dialects.registerDialect(dialect)
    finally:
        spark.stop()


def _text(value: object) -> object:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    if isinstance(value, list):
        return [_text(v) for v in value]
    return str(value)


if __name__ == "__main__":
    main(*sys.argv[1:5], json.loads(sys.argv[5]), sys.argv[6])
