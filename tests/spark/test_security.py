"""etcd with TLS (client certificates) and a password, S3 with keys: the broker, the connector,
the stream into Delta and the speed layer (masters, gateway, a pipeline's commit announcer) all
work through them, and no secret appears anywhere a user or an operator looks: logs (ours, the
broker's, Spark's, the speed layer's), error messages, query progress, Delta commit metadata and
every etcd record (subscriptions, cursors, lag, registrations, assignments, announcements)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
import yaml
from danube import DanubeClientBuilder, DispatchStrategy

from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.ports import free_port
from tests.integration.broker_process import REPO_ROOT, BrokerProcess
from tests.tls import secured_etcd

pytestmark = pytest.mark.spark

ETCD_PASSWORD = "etcd-Pw-7Qx9-not-for-logs"
S3_KEY, S3_SECRET = "AKIADANUBETESTKEY42", "s3-Secret-Zk81pQ-not-for-logs"
SECRETS = (ETCD_PASSWORD, S3_SECRET)


@pytest.fixture(scope="module")
def secure_etcd(tmp_path_factory):
    with secured_etcd(tmp_path_factory.mktemp("certs"), ETCD_PASSWORD) as secured:
        yield secured


def assert_no_secret(where: str, text: str, more: tuple[str, ...] = ()) -> None:
    for secret in (*SECRETS, *more):
        assert secret not in text, f"a secret appears in {where}"


def key_material(certs) -> tuple[str, ...]:
    """The client key's PEM lines: key material must appear nowhere either (its path may)."""
    return tuple(line for line in Path(certs.key).read_text().splitlines() if line and not line.startswith("-----"))


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


WRONG_PASSWORD = "wrong-" + ETCD_PASSWORD[::-1]


def speed_layer_process(role: str, config: dict, path: Path, password: str) -> subprocess.CompletedProcess:
    """`python -m speedlayer <role>` on `config`, the password in the environment as an operator
    would; for configurations that must fail at once."""
    path.write_text(json.dumps(config))
    args = ["--id", "bad", "--port", str(free_port())] if role == "master" else ["--port", str(free_port())]
    return subprocess.run([sys.executable, "-m", "speedlayer", role, "--config", str(path), *args], cwd=path.parent,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "SPEEDLAYER_ETCD__PASSWORD": password})


def one_error(done: subprocess.CompletedProcess) -> str:
    """The one `error:` line of a process that failed on its configuration (gRPC's own
    handshake log lines may precede it), no traceback."""
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 1 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    return errors[0]


def test_speed_layer_masters_gateway_and_announcer_on_tls_etcd_with_a_password_and_no_secret_anywhere(
        secure_etcd, tmp_path, unique_name):
    import pyarrow as pa
    from deltalake import write_deltalake

    from danube_core.metadata_memory import MemoryMetadataStore
    from devstack.speedlayer_stack import EmbeddedSpeedLayer
    from pipelines.speedlayer_feed import CommitAnnouncer, SpeedLayerFeed, feed_etcd_settings
    from speedlayer.clients import query

    etcd, certs = secure_etcd
    secrets = (WRONG_PASSWORD, *key_material(certs))
    tls = {"user": "root", "ca_cert": certs.ca_cert, "cert_key": certs.key, "cert_cert": certs.cert}
    key_root = "/" + unique_name("sl")
    table = str(tmp_path / "orders")
    write_deltalake(table, pa.table({"id": [1, 2, 3], "amount": [10, 20, 30]}))
    layer = EmbeddedSpeedLayer(tmp_path / "speedlayer", etcd.endpoint, key_root=key_root, tenant="acme",
                               etcd=tls, env={"SPEEDLAYER_ETCD__PASSWORD": ETCD_PASSWORD})
    try:
        layer.start(workers=1, worker_memory_mb=512, worker_threads=1)  # the master elected, the worker placed
        layer.admit("orders", table, replication=1)
        layer.wait_queryable("orders")
        answer = query(layer.gateway, "acme", "orders", "SELECT sum(amount) AS total FROM orders")
        assert answer.to_pylist() == [{"total": 60}]
        # A pipeline feeding the dataset announces with its reader's etcd options (TLS, password).
        reader = {"etcd.endpoints": etcd.endpoint, "etcd.user": "root", "etcd.password": ETCD_PASSWORD,
                  "etcd.caCert": certs.ca_cert, "etcd.certKey": certs.key, "etcd.certCert": certs.cert}
        feed = SpeedLayerFeed("acme", "orders", etcd_endpoints=etcd.endpoint, key_root=key_root)
        announcer = CommitAnnouncer(feed, table, "secure-pipeline", MemoryMetadataStore(),
                                    feed_etcd_settings(feed, reader))
        try:
            assert announcer.announce() and announcer.failures == 0
        finally:
            announcer.close()
    finally:
        layer.stop()
    # Bad input: one error naming the endpoint and what to fix, the password in none of them.
    secured = {"endpoints": etcd.endpoint, "key_root": key_root, "timeout_ms": 3000}
    refused = speed_layer_process("master", {"etcd": {**secured, **tls}}, tmp_path / "wrong-password.yaml",
                                  WRONG_PASSWORD)
    wrong_password = one_error(refused)
    assert f"etcd at {etcd.endpoint} rejected the connection check" in wrong_password, wrong_password
    assert "authentication failed" in wrong_password and "check etcd.user and etcd.password" in wrong_password
    plaintext = speed_layer_process("gateway", {"etcd": {**secured, "user": "root"}}, tmp_path / "no-ca.yaml",
                                    ETCD_PASSWORD)
    no_ca = one_error(plaintext)
    assert f"etcd unreachable at {etcd.endpoint}" in no_ca and "set etcd.ca_cert" in no_ca, no_ca
    assert "no-ca.yaml" in no_ca and "wrong-password.yaml" in wrong_password
    with EtcdMetadataStore(etcd.endpoint, user="root", password=ETCD_PASSWORD, ca_cert=certs.ca_cert,
                           cert_key=certs.key, cert_cert=certs.cert) as store:
        records = "\n".join(f"{k} {v!r}" for k, v in store.get_prefix(key_root + "/"))
    logs = {path.name: path.read_text(errors="replace") for path in sorted(layer.root.glob("*.log"))}
    audit = (layer.root / "audit.jsonl").read_text()
    # What is scanned is really there (an empty text would hide nothing):
    assert f"{key_root}/announce/acme/orders" in records and f"{key_root}/assignments/acme/orders/" in records
    assert set(logs) >= {"master.log", "gateway.log", "worker-w1.log"} and "serving on" in logs["master.log"]
    assert "orders" in audit
    for name, text in logs.items():
        assert_no_secret(f"the speed layer's {name}", text, secrets)
    assert_no_secret("the speed layer's audit log", audit, secrets)
    assert_no_secret("the speed layer's errors", "\n".join(p.stdout + p.stderr for p in (refused, plaintext)), secrets)
    assert_no_secret("the speed layer's etcd records", records, secrets)
