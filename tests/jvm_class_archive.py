"""A class-data archive (AppCDS) for the Spark driver JVMs the suite starts.

The suite is bound by CPU on 2 cores, and about 30 of its tests start a Spark driver JVM of
their own (pipelines killed and restarted, spark-submit, the fault battery), each spending
20-30 CPU seconds mostly loading and verifying the same classes. A dynamic CDS archive of a
driver that ran a Delta write and a streaming query lets each later JVM map those classes
instead: measured 98.8 -> 73.8 CPU s for such a driver. Java 17 cannot create the archive on
first use (`-XX:+AutoCreateSharedArchive` came in 19), so `start` has one made by a short
driver in the background and names it in `SPARK_SUBMIT_OPTS` (which spark-submit adds to the
driver JVM's options, in every process the suite starts) right away: a JVM started before the
archive exists runs without it, as it does when the archive does not match its class path
(Spark upgraded, other jars): CDS then stays off quietly and nothing else changes.

The archive is kept under `~/.cache/danube-spark` keyed by the Java, pyspark and package
versions; `DANUBE_TEST_JVM_ARCHIVE=0` turns it off.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

CACHE_DIR = Path.home() / ".cache" / "danube-spark" / "jvm-class-archives"
# The archive is a cache: a JVM that cannot use it says so only in logs turned off here.
USE_OPTIONS = "-XX:SharedArchiveFile={path} -Xlog:cds=off -Xlog:cds+dynamic=off"

# Run by the background process: a driver doing what the suite's drivers do (a Delta write
# and read, a streaming query into Delta), so their classes are in the archive.
_DRIVER = """
import sys, tempfile
from pyspark import SparkContext
from pyspark.sql import SparkSession
from pipelines.session import package_settings
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
         .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
         .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
         .config(map=package_settings()).getOrCreate())
work = tempfile.mkdtemp(prefix="jvm-class-archive-")
spark.range(100).write.format("delta").save(work + "/table")
spark.read.format("delta").load(work + "/table").count()
(spark.readStream.format("rate").option("rowsPerSecond", 10).load().writeStream.format("delta")
 .option("checkpointLocation", work + "/checkpoint").trigger(once=True).start(work + "/stream")
 .awaitTermination())
jvm = SparkContext._gateway.proc
spark.stop()
SparkContext._gateway.shutdown()
jvm.stdin.close()  # the JVM exits when its stdin closes, and writes the archive as it does
jvm.wait()
"""


def archive_path(repo_root: Path) -> Path:
    """Where the archive for this Java, pyspark and these packages is (made or not)."""
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    sys.path.insert(0, str(repo_root))
    from pipelines.session import package_settings

    key = hashlib.sha256("\n".join([java, pyspark.__version__, *package_settings().values()]).encode()).hexdigest()[:16]
    return CACHE_DIR / f"spark-driver-{key}.jsa"


def start(repo_root: Path) -> subprocess.Popen | None:
    """Point every Spark driver started from now on at the archive; if it is not made yet,
    start making it and return that process (the caller waits for it at the end)."""
    if os.environ.get("DANUBE_TEST_JVM_ARCHIVE") == "0":
        return None
    path = archive_path(repo_root)
    options = os.environ.get("SPARK_SUBMIT_OPTS", "")
    os.environ["SPARK_SUBMIT_OPTS"] = f"{options} {USE_OPTIONS.format(path=path)}".strip()
    if path.exists():
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    env = {**os.environ, "SPARK_SUBMIT_OPTS": f"{options} -XX:ArchiveClassesAtExit={partial}".strip(),
           "PYTHONPATH": str(repo_root)}
    # The archive appears under its name only once whole (a JVM maps it as soon as it exists).
    make = (f"import os, subprocess, sys\n"
            f"subprocess.run([sys.executable, '-c', {_DRIVER!r}])\n"
            f"if os.path.exists({str(partial)!r}):\n    os.replace({str(partial)!r}, {str(path)!r})\n")
    return subprocess.Popen([sys.executable, "-c", make], env=env, cwd=repo_root, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(maker: subprocess.Popen, timeout_s: float) -> None:
    """Wait for the archive to be made, or end the making (its driver and JVM too)."""
    try:
        maker.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(maker.pid, signal.SIGKILL)
        maker.wait()
