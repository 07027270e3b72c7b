"""What makes the short local Spark runs of the tests and benchmarks cheaper: JVM options for
their drivers, and a `PYSPARK_PYTHON` for Spark's Python processes that imports the installed
pyspark.

`SHORT_RUN_JVM_OPTIONS`: the C1 compiler alone and the serial GC. The drivers the suite and the
fault battery start work on small data for seconds to minutes, where C2's compilations and G1's
threads cost more than they return (tests/conftest.py has the measurement).

Spark starts its Python processes (the `pyspark.daemon` per worker module and the workers it
forks, a stream source's `python_streaming_source_runner`) with `$SPARK_HOME/python/lib/
pyspark.zip` and py4j's zip first on `PYTHONPATH`. The zip holds Python sources and no
bytecode, so every fresh process compiles the pyspark modules it imports: measured about 1.3 CPU
seconds more per daemon and 0.3-0.4 more per forked worker than importing the byte-compiled
package pip installed. A pipeline run starts four daemons, their workers and a source runner
(about 5 CPU seconds of compiling), and every batch read in a long-lived session forks planner
workers that compile again.

`python_exec_without_zips` writes a wrapper that drops the two zips from `PYTHONPATH` and runs
this interpreter, so those processes import the installed pyspark instead. That is the same code
only when the installed pyspark is the Spark that runs (pip's pyspark, whose SPARK_HOME is its
own package directory): checked here, or ValueError. The test suite uses it for every Spark it
starts (tests/conftest.py); `bench/bench_kafka.py --python-without-zips` uses it as a diagnostic
(a user's Spark gives its processes the zip, so the benchmarks' main figures keep it).
"""

from __future__ import annotations

import stat
import sys
from pathlib import Path

SHORT_RUN_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
WRAPPER_NAME = "python-without-zips"


def python_exec_without_zips(work: Path) -> Path:
    """Write the wrapper into `work` and return its path (to use as `PYSPARK_PYTHON`)."""
    import pyspark
    from pyspark.find_spark_home import _find_spark_home

    installed = Path(pyspark.__file__).resolve().parent
    spark_home = Path(_find_spark_home()).resolve()
    if installed != spark_home:
        raise ValueError(f"the importable pyspark ({installed}) is not the running Spark's ({spark_home}): "
                         "its Python processes must use that Spark's pyspark.zip")
    script = Path(work) / WRAPPER_NAME
    script.write_text(
        "#!/bin/sh\n"
        "# Spark's Python processes, importing the installed (byte-compiled) pyspark instead of\n"
        "# $SPARK_HOME/python/lib/pyspark.zip and py4j-*-src.zip.\n"
        'PYTHONPATH=$(printf %s "$PYTHONPATH" | tr : "\\n" | grep -v -e "/pyspark\\.zip$" '
        '-e "/py4j-[^/]*-src\\.zip$" | paste -sd: -)\n'
        "export PYTHONPATH\n"
        f'exec "{sys.executable}" "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script
