"""`spark-submit.sh`'s own choices, with a stand-in `spark-submit` on PATH: which log4j file
the driver gets, what `--verbose` changes, and that Spark's stderr goes through the Ivy filter.

A real run (tests/integration/test_spark_submit.py) takes over a minute; this one takes
seconds. The script still builds its archive under build/spark-submit, as a real run does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.unit

LOG4J = REPO_ROOT / "conf" / "spark-log4j2.properties"
CACHED_IVY = (":: loading settings :: url = jar:file:/x/ivy-2.5.3.jar!/ivysettings.xml\n"
              "Ivy Default Cache set to: /root/.ivy2.5.2/cache\n"
              "\tfound io.delta#delta-spark_4.2_2.13;4.4.0 in central\n"
              ":: resolution report :: resolve 1812ms :: artifacts dl 74ms\n"
              "\t0 artifacts copied, 36 already retrieved (0kB/35ms)\n")
SPARK_WARNING = "26/11/26 22:51:05 WARN Utils: Set SPARK_LOCAL_IP if you need to bind to another address\n"
# Records its arguments and SPARK_SUBMIT_OPTS, then prints what spark-submit prints to stderr.
FAKE_SUBMIT = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["FAKE_SUBMIT_RECORD"], "w") as fh:
    json.dump({{"argv": sys.argv[1:], "opts": os.environ.get("SPARK_SUBMIT_OPTS")}}, fh)
sys.stderr.write({CACHED_IVY + SPARK_WARNING!r})
"""


def submit(tmp_path: Path, *flags: str) -> tuple[subprocess.CompletedProcess, dict]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "spark-submit"
    fake.write_text(FAKE_SUBMIT)
    fake.chmod(0o755)
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text("name: x\n")
    record = tmp_path / "record.json"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_SUBMIT_RECORD": str(record),
           "PYSPARK_PYTHON": sys.executable}
    env.pop("SPARK_SUBMIT_OPTS", None)
    done = subprocess.run([str(REPO_ROOT / "spark-submit.sh"), "run", str(pipeline), *flags], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done, json.loads(record.read_text())


def test_spark_logs_warnings_only_and_cached_ivy_output_is_hidden_by_default(tmp_path):
    """Regression: every run printed ~1,300 INFO lines and Ivy's full resolution report."""
    done, record = submit(tmp_path, "--master", "local[1]")
    assert record["opts"] == f'-Dlog4j2.configurationFile="{LOG4J}"'
    assert "rootLogger.level = warn" in LOG4J.read_text().splitlines()
    assert done.stderr == SPARK_WARNING
    assert "--verbose" not in record["argv"] and record["argv"][-2:] == ["run", str(tmp_path / "pipeline.yaml")]


def test_verbose_keeps_sparks_info_defaults_and_all_of_ivy(tmp_path):
    done, record = submit(tmp_path, "--verbose", "--master", "local[1]")
    assert record["opts"] is None
    assert done.stderr == CACHED_IVY + SPARK_WARNING
    assert record["argv"].count("--verbose") == 1  # spark-submit's own --verbose, passed on


def test_usage_names_the_verbose_flag():
    done = subprocess.run([str(REPO_ROOT / "spark-submit.sh")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--verbose" in done.stderr
