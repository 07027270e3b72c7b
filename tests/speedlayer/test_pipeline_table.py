"""Acceptance: a Delta table written by our pipelines, admitted into three masters and three
workers (every one a real process), is READY on two workers with the table's row count.

The table is the real thing: orders published through our broker, landed by
`pipelines.runner.PipelineRunner` with the shipped `conf/pipelines/orders.yaml` (Delta's
idempotent-write options, a quarantine table beside it), not a table written for the test.
"""

from __future__ import annotations

import json

import pytest

from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.schema_registry import register_schema
from pipelines.config import load_config
from devstack.demo import ORDER_SCHEMA
from devstack.broker_stack import EmbeddedStack
from speedlayer.clients import delta_request
from tests.rig import eventually
from tests.pipeline_files import publish_orders, run_to_end, stack_pipeline_file
from devstack.speedlayer_cluster import ready_workers

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(600)]


def test_pipeline_written_table_is_ready_on_two_of_three_workers(spark, cluster_factory, tmp_path, unique_name):
    with EmbeddedStack(tmp_path / "stack") as stack:
        topic, subject = f"/default/{unique_name('sl-orders')}", unique_name("sl-orders")
        with EtcdMetadataStore(stack.etcd_endpoint) as metadata:
            register_schema(metadata, subject, "JsonSchema", json.dumps(ORDER_SCHEMA))
        publish_orders(stack, topic, 80, schema_subject=subject)
        config = load_config(stack_pipeline_file(stack, tmp_path, unique_name("sl"), topic, subject))
        run_to_end(config, spark)
    tables = {"orders": config.target.path, "orders_quarantine": config.quarantine.path}
    expected = {name: spark.read.format("delta").load(path).count() for name, path in tables.items()}
    assert expected["orders"] > 0 and expected["orders"] + expected["orders_quarantine"] == 80

    cluster = cluster_factory()
    for master in ("m1", "m2", "m3"):
        cluster.start_master(master)
    for worker in ("w1", "w2", "w3"):
        cluster.start_worker("acme", worker)
    client = cluster.client()
    eventually(lambda: len(client.workers("acme").workers) == 3, deadline_s=60)
    for dataset, path in tables.items():
        reply = client.admit(delta_request("acme", dataset, path))
        assert reply.status == "ASSIGNED", reply
        ready = eventually(lambda d=dataset, e=reply.epoch_id: (r := ready_workers(client, "acme", d, e))
                           and len(r) == 2 and r, deadline_s=90)
        assert set(ready.values()) == {expected[dataset]}, (dataset, ready, expected)
