#!/usr/bin/env bash
# The main job on the embedded default: starts a local etcd and our broker on local storage,
# produces a sample topic with the official danube-client, runs the pipeline into a Delta
# table and prints the result, then the speed layer's queries; at the end it prints the console's
# URL and keeps everything up until Ctrl-C (`./demo.sh --no-console`, or CI=1, stops at once).
set -euo pipefail
# Exact versions come from constraints.txt (setup.cfg has the ranges). editable_mode=compat puts the checkout on sys.path through a .pth file, so Spark's data
# source lookup (pkgutil.iter_modules) finds `pyspark_danube` and format("danube") needs no call.
cd "$(dirname "$0")"
python3 -m pip install --quiet --disable-pip-version-check --config-settings editable_mode=compat -c constraints.txt -e ".[all]"
exec python3 -m devstack demo "$@"
