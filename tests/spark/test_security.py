"""etcd with TLS (client certificates) and a password, S3 with keys: the broker, the connector
and the stream into Delta all work through them, and no secret appears anywhere a user or an
operator looks: logs (ours, the broker's, Spark's), error messages, query progress, Delta
commit metadata and every etcd record (subscriptions, cursors, lag, registrations)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys

import boto3
import pytest
import yaml
from danube import DanubeClientBuilder, DispatchStrategy

from devstack.embedded_etcd import EmbeddedEtcd, EtcdSecurity
from devstack.ports import free_port
from danube_core.metadata_etcd import EtcdMetadataStore
from tests.integration.broker_process import REPO_ROOT, BrokerProcess
from tests.tls import make_certificates

pytestmark = pytest.mark.spark

ETCD_PASSWORD = "etcd-Pw-7Qx9-not-for-logs"
S3_KEY, S3_SECRET = "AKIADANUBETESTKEY42", "s3-Secret-Zk81pQ-not-for-logs"
SECRETS = (ETCD_PASSWORD, S3_SECRET)


@pytest.fixture(scope="module")
def secure_etcd(tmp_path_factory):
    certs = make_certificates(tmp_path_factory.mktemp("certs"))
    server = EmbeddedEtcd(security=EtcdSecurity(certs.cert, certs.key, certs.ca_cert, ETCD_PASSWORD))
    yield server, certs
    server.stop()


def assert_no_secret(where: str, text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"a secret appears in {where}"


def run_pipeline_process(tmp_path, options: dict, topic: str) -> str:
    """`python -m pipelines run` on the secure stack, secrets passed through the environment as
    an operator would; returns everything the process and its JVM printed."""
    secrets = {"DANUBE_ETCD_PASSWORD": options["etcd.password"], "DANUBE_STORAGE_OPTIONS": options["storage.options"]}
    config = {
        "name": "secure_pipeline",
        "source": {"etcd_endpoints": options["etcd.endpoints"], "storage_url": options["storage.url"],
                   "topics": [topic], "subscription": "secure-pipeline", "starting_offsets": "earliest",
                   "options": {"etcd.user": "root", "etcd.password": "${DANUBE_ETCD_PASSWORD}",
                               "etcd.caCert": options["etcd.caCert"], "etcd.certKey": options["etcd.certKey"],
                               "etcd.certCert": options["etcd.certCert"],
                               "storage.options": "${DANUBE_STORAGE_OPTIONS}"}},
        "decode": {"format": "raw"},
        "target": {"path": str(tmp_path / "pipeline-target")},
        "quarantine": {"path": str(tmp_path / "pipeline-quarantine")},
        "trigger": {"mode": "availableNow"},
        "checkpoint": str(tmp_path / "pipeline-checkpoint"),
    }
    path = tmp_path / "secure.yaml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run([sys.executable, "-m", "pipelines", "run", str(path)], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **secrets})
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    return output


def test_tls_password_and_s3_keys_end_to_end_with_no_secret_anywhere(
        spark, secure_etcd, moto_s3, tmp_path, unique_name, caplog):
    etcd, certs = secure_etcd
    bucket = unique_name("sec")[:40]
    boto3.client("s3", endpoint_url=moto_s3.endpoint_url, aws_access_key_id=S3_KEY, aws_secret_access_key=S3_SECRET,
                 region_name="us-east-1").create_bucket(Bucket=bucket)
    client_tls = {"user": "root", "password": ETCD_PASSWORD, "ca_cert": certs.ca_cert,
                  "cert_key": certs.key, "cert_cert": certs.cert}
    broker = BrokerProcess(
        etcd.endpoint, tmp_path, "secure", f"s3://{bucket}/danube", etcd_client=client_tls,
        env={"DANUBE_META_STORE__PASSWORD": ETCD_PASSWORD, "DANUBE_WAL_CLOUD__CLOUD__SECRET_KEY": S3_SECRET},
        meta_store={"user": "root", "ca_cert": certs.ca_cert, "cert_key": certs.key, "cert_cert": certs.cert},
        wal_cloud={"wal": {"dir": str(tmp_path / "secure-wal"), "file_sync": {"interval_ms": 50, "durable": True}},
                   "uploader": {"interval_seconds": 1, "root_prefix": "/danube-data"},
                   "cloud": {"backend": "s3", "root": f"s3://{bucket}/danube", "endpoint": moto_s3.endpoint_url,
                             "region": "us-east-1", "access_key": S3_KEY}},
    )
    topic, failures = f"/default/{unique_name('sec')}", []
    options = {"etcd.endpoints": etcd.endpoint, "etcd.user": "root", "etcd.password": ETCD_PASSWORD,
               "etcd.caCert": certs.ca_cert, "etcd.certKey": certs.key, "etcd.certCert": certs.cert,
               "storage.url": f"s3://{bucket}/danube", "topic": topic,
               "storage.options": json.dumps({"key": S3_KEY, "secret": S3_SECRET, "client_kwargs": {
                   "endpoint_url": moto_s3.endpoint_url, "region_name": "us-east-1"}})}
    try:
        broker.start()

        async def produce() -> None:
            client = await DanubeClientBuilder().service_url(broker.url).build()
            producer = (client.new_producer().with_topic(topic).with_name("sec")
                        .with_dispatch_strategy(DispatchStrategy.RELIABLE).build())
            await producer.create()
            for i in range(30):
                await producer.send(f"m-{i}".encode(), {"i": str(i)})

        asyncio.run(produce())
        with caplog.at_level(logging.INFO):
            query = (spark.readStream.format("danube").options(**options)
                     .option("subscription", "secure-sub").option("startingOffsets", "earliest").load()
                     .writeStream.format("delta").option("checkpointLocation", str(tmp_path / "chk"))
                     .trigger(availableNow=True).start(str(tmp_path / "table")))
            query.awaitTermination(300)
            assert query.exception() is None
            table = spark.read.format("delta").load(str(tmp_path / "table"))
            assert sorted(r["offset"] for r in table.select("offset").collect()) == list(range(30))
            unreachable_s3 = options["storage.options"].replace(moto_s3.endpoint_url, f"http://127.0.0.1:{free_port()}")
            for bad in ({"etcd.password": "wrong-" + ETCD_PASSWORD[::-1]},  # etcd refuses it
                        {"storage.options": unreachable_s3, "etcd.timeoutMs": "3000"}):  # S3 cannot be reached
                with pytest.raises(Exception) as info:
                    spark.read.format("danube").options(**{**options, **bad}).load().collect()
                failures.append(str(info.value))
            progress = json.dumps([json.loads(p.json) for p in query.recentProgress])
            history = json.dumps([r.asDict(recursive=True) for r in spark.sql(
                f"DESCRIBE HISTORY delta.`{tmp_path / 'table'}`").collect()], default=str)
        with EtcdMetadataStore(etcd.endpoint, **client_tls) as store:
            records = "\n".join(f"{k} {v!r}" for k, v in store.get_prefix("/"))
        assert "secure-sub" in records  # the subscription record and its cursor are there
    finally:
        broker.stop()
    pipeline_output = run_pipeline_process(tmp_path, options, topic)
    # What is scanned is really there (an empty text would hide nothing):
    assert topic in broker.log_tail(100_000) and "secure-sub" in progress and "STREAMING UPDATE" in history
    assert caplog.records and "batch" in pipeline_output
    assert_no_secret("the broker's log", broker.log_tail(100_000))
    assert_no_secret("a pipeline's output (driver, Spark JVM and Python workers)", pipeline_output)
    assert_no_secret("log records", "\n".join(r.getMessage() for r in caplog.records))
    assert_no_secret("error messages", "\n".join(failures))
    assert_no_secret("query progress", progress)
    assert_no_secret("Delta commit history", history)
    assert_no_secret("etcd records", records)
    assert "authentication failed" in failures[0] and "ObjectStoreError" in failures[1], failures
