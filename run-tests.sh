#!/usr/bin/env bash
# Runs the whole test suite. Installs what it needs first; the tests start their own
# etcd server, moto S3 server and local Spark session.
set -euo pipefail
# Exact versions come from constraints.txt (setup.cfg has the ranges). editable_mode=compat puts the checkout on sys.path through a .pth file, so Spark's data
# source lookup (pkgutil.iter_modules) finds `pyspark_danube` and format("danube") needs no call.
cd "$(dirname "$0")"
# DANUBE_TESTS_INSTALLED=1 skips it for a caller that has just run this same install (.ci/run,
# which lints first): a second pip run costs about 25 seconds for nothing.
if [[ "${DANUBE_TESTS_INSTALLED:-0}" != 1 ]]; then
  python3 -m pip install --quiet --disable-pip-version-check --config-settings editable_mode=compat -c constraints.txt -e ".[all,test]"
fi
# -n: pytest-xdist workers. Most of the suite's time is spent waiting on the processes it starts
# (brokers, pipelines, masters, etcd restarts, pip), so four workers on two cores overlap those
# waits (a fresh-clone run on three used 1,234 CPU s in 26 minutes: 0.8 of the 2 cores);
# `--dist loadgroup` keeps every test of the one Spark session on one worker, and a module's shared fixture on one
# (tests/conftest.py). DANUBE_TEST_WORKERS=0 runs everything in this process.
# --durations: the slowest tests are listed at the end, to keep the suite well inside CI's time.
# --deselect: the notebooks' tests run on Databricks' Spark line (4.0) instead, in a venv of
# their own (tests/integration/test_spark_versions.py); on the suite's Spark they took about 200 s
# of the one Spark session, every test of which runs on one worker.
# The short soak (tests/integration/test_soak.py: the whole platform, some 15 processes, under
# faults) runs alone after the others when the whole suite runs: beside them it pushed the load
# past what Spark waits for a new Python worker to connect back (a Spark-line test failed so
# in one run). With arguments, it is selected like any other test.
# Python writes bytecode caches for this run: a machine whose environment sets
# PYTHONDONTWRITEBYTECODE (as CI's does) otherwise compiles the project's modules (and pytest
# rewrites the test modules) from source again in every process the suite starts: each pytest
# worker's collection took 13.9 CPU s without the caches, 8.7 with them, and each broker,
# pipeline, Spark worker and speed-layer process pays the same for the modules it imports.
unset PYTHONDONTWRITEBYTECODE
POOL=(python3 -m pytest -q --durations=20 -n "${DANUBE_TEST_WORKERS:-4}" --dist loadgroup
      --deselect tests/spark/test_notebooks.py)
if [[ $# -eq 0 ]]; then
  "${POOL[@]}" --deselect tests/integration/test_soak.py tests
  exec python3 -m pytest -q --durations=1 tests/integration/test_soak.py
fi
exec "${POOL[@]}" "$@" tests
