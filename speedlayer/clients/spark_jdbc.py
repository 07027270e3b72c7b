"""Spark's JDBC reader on the Data Gateway: the Flight SQL dialect jar that lets it load every column.

Spark's JDBC reader (4.0-4.3) maps a column from the JDBC type the driver reports, and the Arrow
Flight SQL JDBC driver reports a zoned timestamp as TIMESTAMP_WITH_TIMEZONE (18.x), a list as
ARRAY and a struct or map as JAVA_OBJECT, all of which Spark refuses (UNRECOGNIZED_SQL_TYPE).
The driver takes those types from the Arrow types alone, so the gateway cannot change them
without changing every other client's values; a Spark `JdbcDialect` for Flight SQL URLs can
(`jdbc_dialect/danube/speedlayer/FlightSqlDialect.java` says what it maps and why). Spark
registers every dialect its ServiceLoader finds, so the jar on `spark.jars` beside the driver's is
all a session needs:

    from speedlayer.clients.spark_jdbc import dialect_jar
    spark = SparkSession.builder.config("spark.jars", f"{driver_jar},{dialect_jar()}").getOrCreate()

or `--jars "$(python -m speedlayer.clients.spark_jdbc)",...` for `spark-submit`. The jar is built
from its source with a JDK's `javac` against compile-time stand-ins of the few Spark classes it
names (`jdbc_dialect/stubs`), so building it downloads nothing; a wheel carries it built
(`JAR_NAME` next to this module) and then no compiler is needed; otherwise it is built once into
a cache keyed by the source's hash.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

DIALECT_CLASS = "danube.speedlayer.FlightSqlDialect"
SERVICE = "META-INF/services/org.apache.spark.sql.jdbc.JdbcDialect"
SOURCE_ROOT = Path(__file__).with_name("jdbc_dialect")
JAR_NAME = "danube-flight-sql-dialect.jar"
# Spark 4 runs on Java 17 and later: the class files are Java 17's.
JAVA_RELEASE = "17"


class DialectBuildError(RuntimeError):
    """The dialect's jar could not be built here (no `javac`, or it failed): says what to do."""


def _sources() -> list[Path]:
    return sorted(SOURCE_ROOT.rglob("*.java"))


def source_digest() -> str:
    """A hash of the dialect's source and stand-ins: the cache key of a jar built from them."""
    digest = hashlib.sha256()
    for path in _sources():
        digest.update(path.relative_to(SOURCE_ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def dialect_jar(cache_dir: Path | None = None) -> Path:
    """The dialect's jar: the one installed beside this module (a wheel's), else one built from
    the source into `cache_dir` (default `~/.cache/danube-spark`, or `$DANUBE_SPARK_CACHE`),
    once per source version. DialectBuildError if it must be built and cannot be."""
    packaged = Path(__file__).with_name(JAR_NAME)
    if packaged.is_file():
        return packaged
    cache = cache_dir or Path(os.environ.get("DANUBE_SPARK_CACHE", Path.home() / ".cache" / "danube-spark"))
    jar = cache / f"danube-flight-sql-dialect-{source_digest()}.jar"
    if not jar.is_file():
        build_jar(jar)
    return jar


def build_jar(target: Path) -> Path:
    """Compile the dialect with `javac` and write its jar (the dialect's class and the
    ServiceLoader entry; never the stand-ins) to `target`, atomically."""
    javac = shutil.which("javac")
    if javac is None:
        raise DialectBuildError(
            f"building the Spark JDBC dialect jar ({JAR_NAME}) needs a JDK's javac, which is not on the PATH: "
            "install a JDK 17+, or use a wheel of this project, which carries the jar built")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="flight-sql-dialect-") as scratch:
        classes = Path(scratch) / "classes"
        result = subprocess.run([javac, "--release", JAVA_RELEASE, "-nowarn", "-d", str(classes),
                                 *map(str, _sources())], capture_output=True, text=True)
        if result.returncode != 0:
            raise DialectBuildError(f"javac could not compile the Spark JDBC dialect:\n{result.stderr[-3000:]}")
        partial = target.with_name(f"{target.name}.{os.getpid()}.part")  # same directory: replaced atomically
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\nCreated-By: danube-spark\r\n\r\n")
            jar.writestr(SERVICE, DIALECT_CLASS + "\n")
            for path in sorted(classes.rglob("*.class")):
                name = path.relative_to(classes).as_posix()
                if name.startswith(DIALECT_CLASS.rsplit(".", 1)[0].replace(".", "/") + "/"):
                    jar.write(path, name)
        os.replace(partial, target)
    return target


def main() -> int:
    """`python -m speedlayer.clients.spark_jdbc`: print the jar's path (for `--jars`)."""
    try:
        print(dialect_jar())
    except DialectBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
