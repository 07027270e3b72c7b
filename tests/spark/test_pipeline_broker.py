"""End to end through our broker: danube-client -> broker -> pipeline -> Delta, and a killed driver.

One embedded stack (its own etcd + a broker subprocess) serves the module. The pipeline file is
the shipped `conf/pipelines/orders.yaml` with its topic, subscription and paths changed, so
the demo's configuration is what gets tested. The second test runs the driver as a real
subprocess, SIGKILLs its whole process group (driver, JVM, Python workers) mid-stream and
restarts the pipeline: exactly once, and the etcd cursor never ahead of Delta.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from danube_core.keys import cursor_key
from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.records import parse_cursor
from danube_core.schema_registry import register_schema
from pipelines.config import load_config
from devstack.demo import ORDER_SCHEMA, produce, sample_orders
from devstack import REPO_ROOT
from devstack.broker_stack import EmbeddedStack
from pipelines.runner import PipelineRunner
from tests.pipeline_files import orders_pipeline_file
from tests.rig import eventually

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with EmbeddedStack(tmp_path_factory.mktemp("stack")) as running:
        yield running


def publish(stack: EmbeddedStack, topic: str, count: int,
            schema_subject: str | None = None) -> list[tuple[bytes, bool]]:
    """`count` sample orders, sent one at a time so message i gets offset i."""
    orders = sample_orders(count)
    asyncio.run(produce(stack.service_url, topic, [p for p, _ in orders], concurrency=1,
                        schema_subject=schema_subject))
    return orders


def pipeline_file(stack: EmbeddedStack, root: Path, name: str, topic: str, subject: str, **changes) -> Path:
    """orders.yaml for `topic`, with everything under `root` and `changes` laid over it."""
    source = dict(etcd_endpoints=stack.etcd_endpoint, storage_url=stack.storage_url, topics=[topic],
                  subscription=name)
    return orders_pipeline_file(root, subject=subject, name=name, source_keys=source, **changes)


def run_to_end(config, spark) -> None:
    """Run an availableNow pipeline until it has read everything, then stop it."""
    runner = PipelineRunner(config, spark)
    try:
        runner.run()
    finally:
        runner.stop()


def check_exactly_once(spark, config, orders: list[tuple[bytes, bool]], topic: str) -> None:
    target = spark.read.format("delta").load(config.target.path).collect()
    quarantine = spark.read.format("delta").load(config.quarantine.path).collect()
    keys = [(r["_topic"], r["_offset"]) for r in target + quarantine]
    assert len(keys) == len(set(keys)) == len(orders), "every message exactly once, in one of the two tables"
    assert {r["_offset"] for r in target} == {i for i, (_, ok) in enumerate(orders) if ok}
    assert {r["_offset"] for r in quarantine} == {i for i, (_, ok) in enumerate(orders) if not ok}
    assert all(bytes(r["payload"]) == orders[r["_offset"]][0] for r in quarantine)
    assert {r["_topic"] for r in target} == {topic}


def test_published_orders_land_in_delta_exactly(stack, spark, tmp_path, unique_name):
    topic = f"/default/{unique_name('orders')}"
    with EtcdMetadataStore(stack.etcd_endpoint) as metadata:
        subject = unique_name("orders")
        schema_id, version = register_schema(metadata, subject, "JsonSchema", json.dumps(ORDER_SCHEMA))
        orders = publish(stack, topic, 60, schema_subject=subject)  # stamped through the broker's registry
        config = load_config(pipeline_file(stack, tmp_path, unique_name("e2e"), topic, subject))
        run_to_end(config, spark)
        check_exactly_once(spark, config, orders, topic)
        stamps = spark.read.format("delta").load(config.target.path).select("_schema_id", "_schema_version")
        assert {tuple(r) for r in stamps.distinct().collect()} == {(schema_id, version)}
        key = cursor_key(topic, config.source.subscription)
        assert parse_cursor(metadata.get(key), key) == 59


def delta_commits(table: Path) -> int:
    log = table / "_delta_log"
    return len(list(log.glob("*.json"))) if log.exists() else 0


def max_offset(spark, *paths: str) -> int:
    from delta.tables import DeltaTable

    found = [spark.read.format("delta").load(p).agg({"_offset": "max"}).first()[0]
             for p in paths if DeltaTable.isDeltaTable(spark, p)]
    return max((f for f in found if f is not None), default=-1)


def test_driver_killed_mid_stream_restarts_exactly_once(stack, spark, tmp_path, unique_name):
    topic = f"/default/{unique_name('kill')}"
    name = unique_name("kill")
    with EtcdMetadataStore(stack.etcd_endpoint) as metadata:
        subject = unique_name("orders")
        register_schema(metadata, subject, "JsonSchema", json.dumps(ORDER_SCHEMA))
        orders = publish(stack, topic, 150)
        streaming = pipeline_file(stack, tmp_path, name, topic, subject,
                                  trigger={"mode": "processingTime", "interval": "500 ms"},
                                  source={"max_messages_per_trigger": 15})
        driver = subprocess.Popen([sys.executable, "-m", "pipelines", "run", str(streaming)], cwd=str(REPO_ROOT),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            eventually(lambda: delta_commits(tmp_path / "target") >= 2 or driver.poll() is not None,
                       deadline_s=600, interval_s=0.2)
        finally:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(30)
        assert driver.returncode == -signal.SIGKILL, "the driver ended before it could be killed mid-stream"
        config = load_config(streaming)
        key = cursor_key(topic, name)
        raw = metadata.get(key)
        in_delta = max_offset(spark, config.target.path, config.quarantine.path)
        assert 0 <= in_delta < 149, "killed mid-stream: some but not all batches written"
        assert raw is None or parse_cursor(raw, key) <= in_delta, "cursor ahead of Delta"

        restarted = load_config(pipeline_file(stack, tmp_path, name, topic, subject))  # same name: same txnAppId
        run_to_end(restarted, spark)
        check_exactly_once(spark, restarted, orders, topic)
        assert parse_cursor(metadata.get(key), key) == 149
