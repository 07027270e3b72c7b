#!/usr/bin/env bash
# Runs a pipeline with spark-submit: the same code as `python -m pipelines run <file>`.
#
#   ./spark-submit.sh run conf/pipelines/<name>.yaml [spark-submit flags...]
#
# Local by default (--master local[*]); any spark-submit flag passes through, e.g.
#   ./spark-submit.sh run conf/pipelines/orders.yaml --master spark://host:7077 --executor-memory 4g
# --conf settings are kept as given: the pipeline's session only fills in defaults for settings
# nothing has set (e.g. spark.sql.shuffle.partitions=4 unless --conf names another value).
# It adds the Delta and spark-avro packages (coordinates from pipelines/session.py; a
# --packages you give is merged with them), leaving out the jars of theirs that Spark ships
# itself (--exclude-packages, merged with yours likewise) and ships the project's code to the executors as an
# archive extracted next to each executor (`danube_spark/`, put on their PYTHONPATH). An
# archive rather than --py-files because Python cannot import the compiled frame decoder
# (danube_core/_fastdecode) from inside a zip. The driver runs in client mode from this checkout.
#
# Spark logs warnings and errors only (conf/spark-log4j2.properties), and Ivy's resolution of
# the packages is shown only when it downloads a jar or fails (pipelines/ivy_output.py).
# --verbose (or -v) gives Spark's INFO logs and all of Ivy's output, and is passed on to
# spark-submit, which then prints its parsed arguments as well.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYSPARK_PYTHON:-python3}"

usage() {
  echo "usage: $0 run <pipeline.yaml> [--verbose] [spark-submit flags...]" >&2
  echo "  --verbose, -v  Spark's INFO logs and Ivy's full resolution output (default: warnings only)" >&2
  exit 2
}

[[ $# -ge 2 && "$1" == "run" ]] || usage
CONFIG="$2"
shift 2
[[ -f "$CONFIG" ]] || { echo "error: pipeline file $CONFIG does not exist" >&2; exit 2; }

export PYTHONPATH="${ROOT}${PYTHONPATH:+:$PYTHONPATH}"
# A Spark with no Delta release (or a mismatched delta-spark) is named here, in one line.
PACKAGES="$("$PYTHON" -c 'import sys
from danube_core.errors import ConfigError
from pipelines.session import spark_packages
try:
    print(",".join(spark_packages()))
except ConfigError as error:
    sys.exit(f"error: {error}")')" || exit 2
EXCLUDES="$("$PYTHON" -c 'from pipelines.session import spark_provided; print(",".join(spark_provided()))')"

# Pass the caller's flags through, merging --packages and noticing --master and --verbose.
MASTER_GIVEN=0
VERBOSE=0
PASSTHROUGH=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --packages) PACKAGES="${PACKAGES},$2"; shift 2 ;;
    --packages=*) PACKAGES="${PACKAGES},${1#--packages=}"; shift ;;
    --exclude-packages) EXCLUDES="${EXCLUDES},$2"; shift 2 ;;
    --exclude-packages=*) EXCLUDES="${EXCLUDES},${1#--exclude-packages=}"; shift ;;
    --master|--master=*) MASTER_GIVEN=1; PASSTHROUGH+=("$1"); shift ;;
    --verbose|-v) VERBOSE=1; PASSTHROUGH+=("$1"); shift ;;
    *) PASSTHROUGH+=("$1"); shift ;;
  esac
done
DEFAULTS=()
[[ $MASTER_GIVEN -eq 1 ]] || DEFAULTS+=(--master "local[*]")

BUILD="${ROOT}/build/spark-submit"
ARCHIVE="${BUILD}/danube-spark.zip"
# The application file lives outside the package, so the package's modules never shadow
# top-level ones through the script's directory on sys.path.
LAUNCHER="${BUILD}/run_pipeline.py"
"$PYTHON" - "$ROOT" "$ARCHIVE" "$LAUNCHER" <<'EOF'
import os, sys, zipfile
root, archive, launcher = sys.argv[1:4]
os.makedirs(os.path.dirname(archive), exist_ok=True)
with open(launcher, "w") as fh:
    fh.write("import sys\nfrom pipelines.__main__ import main\n\nsys.exit(main())\n")
with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
    for package in ("danube_core", "connectors", "pipelines", "pyspark_danube"):
        for folder, dirs, files in os.walk(os.path.join(root, package)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                if not name.endswith(".pyc"):
                    path = os.path.join(folder, name)
                    zf.write(path, os.path.relpath(path, root))
EOF

SUBMIT=(spark-submit
  "${DEFAULTS[@]}"
  --name "danube-pipeline-$(basename "$CONFIG" .yaml)"
  --packages "$PACKAGES"
  --exclude-packages "$EXCLUDES"
  --archives "${ARCHIVE}#danube_spark"
  --conf spark.executorEnv.PYTHONPATH=danube_spark
  --conf spark.yarn.appMasterEnv.PYTHONPATH=danube_spark
  --conf "spark.pyspark.python=${PYTHON}"
  "${PASSTHROUGH[@]}"
  "$LAUNCHER" run "$CONFIG")

[[ $VERBOSE -eq 0 ]] || exec "${SUBMIT[@]}"
# SPARK_SUBMIT_OPTS reaches the JVM spark-submit starts, which is the driver in client mode,
# before any other Java option; the quotes keep a path with spaces whole.
export SPARK_SUBMIT_OPTS="-Dlog4j2.configurationFile=\"${ROOT}/conf/spark-log4j2.properties\"${SPARK_SUBMIT_OPTS:+ $SPARK_SUBMIT_OPTS}"
# The filter ignores Ctrl-C (the JVM gets it too): it must stay to pass on what Spark prints
# while it stops.
exec "${SUBMIT[@]}" 2> >(trap '' INT; exec "$PYTHON" -m pipelines.ivy_output >&2)
