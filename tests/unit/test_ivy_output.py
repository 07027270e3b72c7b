"""The stderr filter of spark-submit.sh: Ivy's resolution output only when it downloaded or failed."""

from __future__ import annotations

import io

import pytest

from pipelines.ivy_output import filter_lines, main

pytestmark = pytest.mark.unit

BEFORE = ["WARNING: Using incubator modules: jdk.incubator.vector\n",
          "26/11/26 22:51:05 WARN Utils: Set SPARK_LOCAL_IP if you need to bind to another address\n"]
AFTER = ["26/11/26 22:51:08 WARN NativeCodeLoader: Unable to load native-hadoop library\n"]
# As spark-submit 4.2 prints them (Spark's MavenUtils and Ivy 2.5.3), shortened.
HEAD = [
    ":: loading settings :: url = jar:file:/pyspark/jars/ivy-2.5.3.jar!/org/apache/ivy/core/settings/ivysettings.xml\n",
    "Ivy Default Cache set to: /root/.ivy2.5.2/cache\n",
    "The jars for the packages stored in: /root/.ivy2.5.2/jars\n",
    "io.delta#delta-spark_4.2_2.13 added as a dependency\n",
    ":: resolving dependencies :: org.apache.spark#spark-submit-parent-07872a06;1.0\n",
    "\tconfs: [default]\n",
    "\tfound io.delta#delta-spark_4.2_2.13;4.4.0 in central\n",
]
DOWNLOAD = [
    "downloading https://repo1.maven.org/maven2/io/delta/delta-spark_4.2_2.13/4.4.0/delta-spark_4.2_2.13-4.4.0.jar ...\n",
    "\t[SUCCESSFUL ] io.delta#delta-spark_4.2_2.13;4.4.0!delta-spark_4.2_2.13.jar (452ms)\n",
]
REPORT = [
    ":: resolution report :: resolve 1812ms :: artifacts dl 74ms\n",
    "\t:: modules in use:\n",
    "\tio.delta#delta-spark_4.2_2.13;4.4.0 from central in [default]\n",
    "\t---------------------------------------------------------------------\n",
    ":: retrieving :: org.apache.spark#spark-submit-parent-07872a06\n",
    "\tconfs: [default]\n",
]
CACHED_END = ["\t0 artifacts copied, 36 already retrieved (0kB/35ms)\n"]
DOWNLOADED_END = ["\t36 artifacts copied, 0 already retrieved (80512kB/215ms)\n"]
UNRESOLVED = [
    ":: problems summary ::\n",
    ":::: WARNINGS\n",
    "\t\tmodule not found: io.delta#delta-spark_4.2_2.13;9.9.9\n",
    "\t\t::          UNRESOLVED DEPENDENCIES         ::\n",
]
EXCEPTION = ['Exception in thread "main" java.lang.RuntimeException: [unresolved dependency: '
             "io.delta#delta-spark_4.2_2.13;9.9.9: not found]\n",
             "\tat org.apache.spark.util.MavenUtils$.resolveMavenCoordinates(MavenUtils.scala:474)\n"]


@pytest.mark.parametrize("lines, expected", [
    pytest.param(BEFORE + HEAD + REPORT + CACHED_END + AFTER, BEFORE + AFTER, id="cached-jars-hidden"),
    pytest.param(BEFORE + HEAD + DOWNLOAD + REPORT + DOWNLOADED_END + AFTER,
                 BEFORE + HEAD + DOWNLOAD + REPORT + DOWNLOADED_END + AFTER, id="download-shown"),
    pytest.param(HEAD + UNRESOLVED + EXCEPTION, HEAD + UNRESOLVED + EXCEPTION, id="failed-resolution-shown"),
    pytest.param(HEAD + REPORT, HEAD + REPORT, id="stream-ends-inside-the-block"),
    pytest.param(BEFORE + AFTER, BEFORE + AFTER, id="no-packages"),
    pytest.param(HEAD + REPORT + CACHED_END + HEAD + DOWNLOAD + REPORT + DOWNLOADED_END,
                 HEAD + DOWNLOAD + REPORT + DOWNLOADED_END, id="each-block-on-its-own"),
])
def test_ivy_block_is_shown_only_for_a_download_or_a_failure(lines, expected):
    assert list(filter_lines(lines)) == expected


def test_main_copies_everything_else_unchanged():
    sink = io.StringIO()
    assert main(io.StringIO("".join(BEFORE + HEAD + REPORT + CACHED_END + AFTER)), sink) == 0
    assert sink.getvalue() == "".join(BEFORE + AFTER)
