"""The demo pipeline on a real Spark standalone cluster: `./spark-submit.sh run ... --master spark://`.

A master and two workers (one core each) run as separate processes from the installed pyspark;
the driver is the spark-submit process; executors are the workers' children with Python
processes of their own. The topic is written by our broker to S3 (moto): the first half
uploaded as objects, the second half only in the broker's WAL, which it serves over HTTP
(`wal_cloud.wal.http_listen`) and advertises, so executors read the tail through that URL.

What it proves, with `tests/executor_guard` on the executors' PYTHONPATH:
* the code ships: executors import the project only from the archive spark-submit.sh sends
  (never from this checkout), compiled frame decoder included (`danube_core.arrow_decode`
  imports it unconditionally);
* executors never need etcd: importing its client on an executor fails the task;
* the result: every message in exactly one of the Delta table and the quarantine, and the
  subscription cursor in etcd at the last offset.

Measured: 14 minutes on 2 cores under a load average of about 30 (other suites running).
Known limit: Spark 4.2 gives each Python process it starts on the driver (the streaming source's
runner) 10 s to connect back, hard-coded in `PythonWorkerFactory.createSimpleWorker`; on a
machine so loaded that starting an interpreter takes longer (seen at a load average of 40 on 2
cores), the query fails with "Python worker failed to connect back", whatever this code does.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

from danube_core.keys import cursor_key, register_key
from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.records import parse_cursor
from danube_core.schema_registry import register_schema
from danube_core.topics import TopicName
from devstack.demo import ORDER_SCHEMA, produce, sample_orders
from devstack import REPO_ROOT
from tests.integration.broker_process import BrokerProcess, run_admin
from tests.integration.test_spark_submit import delta_records
from tests.pipeline_files import orders_pipeline_file
from tests.rig import eventually
from devstack.short_spark_runs import SHORT_RUN_JVM_OPTIONS
from tests.spark_standalone import SparkStandaloneCluster, short_run_java_options

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

GUARD = Path(__file__).resolve().parents[1] / "executor_guard"
UPLOADED, TAIL = 40, 30  # messages in objects on S3; then messages in the broker's WAL


def _uploaded_through(etcd_endpoint: str, topic: str) -> int:
    rows = run_admin(etcd_endpoint, "topics", "storage", topic)
    return max((row["value"]["end_offset"] for row in rows if row["kind"] == "descriptor"), default=-1)


def _owner(etcd_endpoint: str, topic: str) -> int | None:
    rows = run_admin(etcd_endpoint, "topics", "list", topic.split("/")[1])
    return next((row["owner"] for row in rows if row["topic"] == topic), None)


def _broker(etcd_endpoint: str, tmp_path: Path, moto_s3, bucket: str, *, upload_every_s: int,
            port: int | None = None):
    cloud = {"backend": "s3", "root": f"s3://{bucket}/danube", "endpoint": moto_s3.endpoint_url,
             "region": "us-east-1", "access_key": "testing", "secret_key": "testing"}
    return BrokerProcess(etcd_endpoint, tmp_path, "b", cloud["root"], port=port, wal_cloud={
        "wal": {"dir": str(tmp_path / "b" / "wal"), "http_listen": "127.0.0.1:0",
                "file_sync": {"interval_ms": 50, "durable": True}},
        "uploader": {"interval_seconds": upload_every_s, "root_prefix": "/danube-data"},
        "cloud": cloud}).start()


def _pipeline_file(tmp_path: Path, etcd_endpoint: str, moto_s3, bucket: str, topic: str, subject: str) -> Path:
    return orders_pipeline_file(tmp_path, subject=subject, name="cluster-orders", source_keys=dict(
        etcd_endpoints=etcd_endpoint, storage_url=f"s3://{bucket}/danube", topics=[topic],
        subscription="cluster-orders", max_messages_per_trigger=25,
        storage_options={"key": "testing", "secret": "testing",
                         "client_kwargs": {"endpoint_url": moto_s3.endpoint_url, "region_name": "us-east-1"}}))


def test_pipeline_runs_on_a_standalone_cluster(etcd_endpoint, moto_s3, s3_bucket, tmp_path, unique_name):
    topic, subject = f"/default/{unique_name('cluster')}", unique_name("cluster-orders")
    orders = sample_orders(UPLOADED + TAIL)
    with EtcdMetadataStore(etcd_endpoint) as metadata:
        register_schema(metadata, subject, "JsonSchema", json.dumps(ORDER_SCHEMA))
    broker = _broker(etcd_endpoint, tmp_path, moto_s3, s3_bucket, upload_every_s=1)
    try:
        asyncio.run(produce(broker.url, topic, [p for p, _ in orders[:UPLOADED]], concurrency=1,
                            schema_subject=subject))
        eventually(lambda: _uploaded_through(etcd_endpoint, topic) == UPLOADED - 1, 60)
    finally:
        broker.stop()  # hands the topic over, sealed at offset UPLOADED - 1
    # The same broker again, uploading once an hour (after its first cycle at start): what it
    # acknowledges now stays in its WAL for the whole test.
    broker = _broker(etcd_endpoint, tmp_path, moto_s3, s3_bucket, upload_every_s=3600, port=broker.port)
    try:
        # The broker (alone, so the leader) takes the topic back by itself; its uploader's first
        # cycle runs as it loads, before anything new is produced.
        eventually(lambda: _owner(etcd_endpoint, topic) == broker.broker_id, 60)
        asyncio.run(produce(broker.url, topic, [p for p, _ in orders[UPLOADED:]], concurrency=1,
                            schema_subject=subject))
        uploaded = _uploaded_through(etcd_endpoint, topic)
        assert uploaded <= len(orders) - 10, f"only {len(orders) - 1 - uploaded} messages are left in the WAL"
        with EtcdMetadataStore(etcd_endpoint) as metadata:
            wal_url = json.loads(metadata.get(register_key(broker.broker_id)))["wal_url"]
        assert wal_url.startswith("http://127.0.0.1:"), wal_url

        pipeline = _pipeline_file(tmp_path, etcd_endpoint, moto_s3, s3_bucket, topic, subject)
        with SparkStandaloneCluster(tmp_path / "spark", workers=2) as cluster:
            done = subprocess.run(
                [str(REPO_ROOT / "spark-submit.sh"), "run", str(pipeline), "--master", cluster.master_url,
                 "--conf", "spark.ui.enabled=false", "--conf", "spark.executor.cores=1",
                 "--conf", "spark.executor.memory=512m", "--conf", "spark.cores.max=2",
                 "--conf", "spark.sql.shuffle.partitions=2",
                 "--conf", f"spark.executor.extraJavaOptions={short_run_java_options()}",
                 "--conf", f"spark.driver.extraJavaOptions={SHORT_RUN_JVM_OPTIONS}",
                 # after the shipped archive: the guard that refuses etcd and unshipped code
                 "--conf", f"spark.executorEnv.PYTHONPATH=danube_spark:{GUARD}"],
                cwd=str(tmp_path), capture_output=True, text=True, timeout=800,
            )
            logs = cluster.logs()
            executors = cluster.executor_dirs()
        assert done.returncode == 0, (f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-5000:]}\n"
                                      f"cluster:\n{logs[-8000:]}")
        assert "executor_guard" not in logs
        # The master replaces any executor that exits while the application is registered, also one
        # that exits as the driver stops it; such a replacement starts and is killed without a task.
        working = [d for d in executors if "Got assigned task" in (d / "stderr").read_text(errors="replace")]
        assert working, f"no executor ran a task: {executors}"
        assert all(list(d.glob("danube_spark/danube_core/_fastdecode*.so")) for d in working), working
        guarded = [(d / "executor_guard.log").read_text() for d in working if (d / "executor_guard.log").exists()]
        assert guarded, "no executor imported the project's code under the guard"
        assert all("connectors " in text and "/danube_spark/connectors/" in text for text in guarded), guarded

        valid = sum(ok for _, ok in orders)
        assert delta_records(tmp_path / "target") == valid
        assert delta_records(tmp_path / "quarantine") == len(orders) - valid
        with EtcdMetadataStore(etcd_endpoint) as metadata:
            key = cursor_key(TopicName.parse(topic), "cluster-orders")
            assert parse_cursor(metadata.get(key), key) == len(orders) - 1
    finally:
        broker.stop()
