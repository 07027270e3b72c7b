#!/usr/bin/env bash
# Runs every benchmark in bench/; each prints a table and writes JSON to bench/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check --config-settings editable_mode=compat -e ".[test,bench,console]"
mkdir -p bench/results
for script in bench/bench_*.py; do
  echo "== ${script}"
  python3 "${script}"
done
echo "== bench/faults.py"
python3 bench/faults.py
