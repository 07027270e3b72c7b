"""The suite's `PYSPARK_PYTHON` drops only Spark's two zips, and refuses another Spark."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from devstack.short_spark_runs import python_exec_without_zips

pytestmark = pytest.mark.unit


def test_the_wrapper_runs_this_interpreter_without_sparks_zips(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("SPARK_HOME", raising=False)
    wrapper = python_exec_without_zips(tmp_path)
    path = os.pathsep.join(["/spark/python/lib/pyspark.zip", "/spark/python/lib/py4j-0.10.9.9-src.zip",
                            "/work/checkout", "/libs/pyspark.zip.d", "/libs/other.zip"])
    probe = "import json, os, sys; print(json.dumps([sys.executable, os.environ['PYTHONPATH']]))"
    done = subprocess.run([str(wrapper), "-c", probe], env={**os.environ, "PYTHONPATH": path},
                          capture_output=True, text=True, check=True)
    executable, kept = json.loads(done.stdout)
    assert os.path.realpath(executable) == os.path.realpath(sys.executable)
    assert kept == os.pathsep.join(["/work/checkout", "/libs/pyspark.zip.d", "/libs/other.zip"])


def test_another_spark_on_spark_home_is_refused(tmp_path, monkeypatch) -> None:
    """Its Python processes must import its own pyspark (the zip), not the installed one."""
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "spark-4.0.1"))
    with pytest.raises(ValueError, match="is not the running Spark's"):
        python_exec_without_zips(tmp_path)
