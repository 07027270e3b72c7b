#!/usr/bin/env bash
# Runs the whole test suite. Installs what it needs first; the tests start their own
# etcd server, moto S3 server and local Spark session.
set -euo pipefail
cd "$(dirname "$0")"
python3 -m pip install --quiet --disable-pip-version-check -e ".[test]"
exec python3 -m pytest -q "$@" tests
