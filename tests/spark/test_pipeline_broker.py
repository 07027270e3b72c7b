"""End to end through our broker: danube-client -> broker -> pipeline -> Delta.

One embedded stack (its own etcd + a broker subprocess) serves the module. The pipeline file is
the shipped `conf/pipelines/orders.yaml` with its topic, subscription and paths changed, so
the demo's configuration is what gets tested. (A driver killed: at every step of a batch in the
fault battery, tests/integration/test_fault_battery.py; mid-stream at a random moment in the
short soak, tests/integration/test_soak.py.)
"""

from __future__ import annotations

import json

import pytest

from danube_core.keys import cursor_key
from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.records import parse_cursor
from danube_core.schema_registry import register_schema
from pipelines.config import load_config
from devstack.demo import ORDER_SCHEMA
from devstack.broker_stack import EmbeddedStack
from tests.pipeline_files import assert_exactly_once, publish_orders, run_to_end, stack_pipeline_file

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with EmbeddedStack(tmp_path_factory.mktemp("stack")) as running:
        yield running


def check_exactly_once(spark, config, orders: list[tuple[bytes, bool]], topic: str) -> None:
    target = spark.read.format("delta").load(config.target.path).collect()
    quarantine = spark.read.format("delta").load(config.quarantine.path).collect()
    assert_exactly_once([r.asDict() for r in target], [r.asDict() for r in quarantine], orders, topic)


def test_published_orders_land_in_delta_exactly(stack, spark, tmp_path, unique_name):
    topic = f"/default/{unique_name('orders')}"
    with EtcdMetadataStore(stack.etcd_endpoint) as metadata:
        subject = unique_name("orders")
        schema_id, version = register_schema(metadata, subject, "JsonSchema", json.dumps(ORDER_SCHEMA))
        orders = publish_orders(stack, topic, 60, schema_subject=subject)  # stamped through the broker's registry
        config = load_config(stack_pipeline_file(stack, tmp_path, unique_name("e2e"), topic, subject))
        run_to_end(config, spark)
        check_exactly_once(spark, config, orders, topic)
        stamps = spark.read.format("delta").load(config.target.path).select("_schema_id", "_schema_version")
        assert {tuple(r) for r in stamps.distinct().collect()} == {(schema_id, version)}
        key = cursor_key(topic, config.source.subscription)
        assert parse_cursor(metadata.get(key), key) == 59
