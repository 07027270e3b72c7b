#!/usr/bin/env bash
# Runs the example Spark Declarative Pipeline: `spark-pipelines run` with Delta (coordinates from
# pipelines/session.py) and the project on the Python workers' PYTHONPATH.
#   pipelines/sdp_example/run.sh [--spec other-spec.yaml] [spark-submit flags...]
# The Connect server that spark-pipelines starts looks data sources up outside the class loader
# that --packages fills, so the Delta jars also go on the driver class path (after one
# resolution into Spark's ivy cache). Only Delta's own jars: the cache's other jars (an older
# Jackson, for one) would shadow Spark's. The Delta catalog is set here for the server and
# again in the spec's `configuration`, which is what the pipeline's own session applies;
# tables land in ./spark-warehouse under the working directory.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SPEC="${ROOT}/pipelines/sdp_example/spark-pipeline.yaml"
if [[ "${1:-}" == "--spec" ]]; then SPEC="$2"; shift 2; fi
export PYTHONPATH="${ROOT}${PYTHONPATH:+:$PYTHONPATH}"
DELTA="$(python3 -c 'from pipelines.session import spark_packages; print(spark_packages()[0])')"
# Delta's dependencies that Spark ships itself are left out (pipelines/session.py says why).
PROVIDED="$(python3 -c 'from pipelines.session import spark_provided; print(",".join(spark_provided()))')"
IFS=: read -r _ ARTIFACT VERSION <<< "$DELTA"
JARS="${SPARK_IVY_DIR:-$HOME/.ivy2.5.2}/jars"
CLASSPATH_JARS="${JARS}/io.delta_${ARTIFACT}-${VERSION}.jar:${JARS}/io.delta_delta-storage-${VERSION}.jar"
if [[ ! -f "${JARS}/io.delta_${ARTIFACT}-${VERSION}.jar" ]]; then
  NOOP="$(mktemp --suffix=.py)"
  spark-submit --packages "$DELTA" --exclude-packages "$PROVIDED" "$NOOP" >/dev/null || { rm -f "$NOOP"; exit 1; }
  rm -f "$NOOP"
fi
exec spark-pipelines run --spec "$SPEC" \
  --packages "$DELTA" \
  --exclude-packages "$PROVIDED" \
  --driver-class-path "$CLASSPATH_JARS" \
  --conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension \
  --conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog \
  "$@"
