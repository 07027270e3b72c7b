"""Pipelines over other shapes: schema evolution mid-stream, Avro payloads, a 3-partition topic."""

from __future__ import annotations

import json

import pytest
from delta.tables import DeltaTable

from danube_core.schema_registry import register_schema
from pipelines.decode import PLANNED_VERSIONS
from pipelines.runner import PipelineRunner
from tests.rig import eventually
from tests.spark.test_pipeline_decode import ORDER_SCHEMA, ids, lake, order  # noqa: F401 (fixture)

pytestmark = pytest.mark.spark

AVRO_ORDER = {
    "type": "record", "name": "Order", "namespace": "demo",
    "fields": [{"name": "order_id", "type": "string"}, {"name": "amount", "type": "double"}],
}


def test_a_new_schema_version_flows_in_without_restarting_the_query(lake):
    subject, schema_id = lake.subject()
    topic = lake.topic(f"/default/{lake.unique_name('evolve')}", schema=(schema_id, 1))
    topic.append(4, payload=lambda o: order(o))
    config = lake.config([topic.name], decode={"format": "json", "subject": subject}, rules=None,
                         trigger={"mode": "processingTime", "interval": "500 ms"})
    runner = PipelineRunner(config, lake.spark)
    query = runner.start()
    try:
        eventually(lambda: lake.count(config.target.path) == 4, deadline_s=180, interval_s=1.0)
        v2 = {**ORDER_SCHEMA, "properties": {**ORDER_SCHEMA["properties"], "coupon": {"type": "string"}}}
        assert register_schema(lake.metadata, subject, "JsonSchema", json.dumps(v2)) == (schema_id, 2)
        topic.schema = (schema_id, 2)
        topic.append(3, payload=lambda o: order(o, coupon=f"c{o}"))
        eventually(lambda: lake.count(config.target.path) == 7, deadline_s=180, interval_s=1.0)
        assert query.isActive and runner.query is query
    finally:
        runner.stop()
    rows = {r["_offset"]: r for r in lake.rows(config.target.path)}
    assert [rows[o]["coupon"] for o in range(7)] == [None] * 4 + ["c4", "c5", "c6"]
    assert [rows[o]["_schema_version"] for o in range(7)] == [1] * 4 + [2] * 3
    assert all(rows[o]["_rescued_data"] is None for o in range(7))
    assert not DeltaTable.isDeltaTable(lake.spark, config.quarantine.path)  # nothing failed


def test_avro_topic_decodes_with_from_avro_and_quarantines_garbage(lake):
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import to_avro

    subject, schema_id = lake.subject(AVRO_ORDER, kind="Avro")
    records = lake.spark.createDataFrame([(f"o{i}", float(i)) for i in range(5)], "order_id string, amount double")
    encoded = [bytes(r[0]) for r in records.select(to_avro(F.struct("order_id", "amount"), json.dumps(AVRO_ORDER))).collect()]
    payloads = {**dict(enumerate(encoded)), 5: b"\x01"}  # a negative string length: not Avro
    topic = lake.topic(f"/default/{lake.unique_name('avro')}", schema=(schema_id, 1))
    topic.append(6, payload=payloads.__getitem__)
    config = lake.config([topic.name], decode={"format": "avro", "subject": subject},
                         rules=[{"type": "expect_column_values_to_be_between", "kwargs": {"column": "amount", "max_value": 3}}])

    lake.run(config)

    target = {r["_offset"]: (r["order_id"], r["amount"]) for r in lake.rows(config.target.path)}
    assert target == {i: (f"o{i}", float(i)) for i in range(4)}
    quarantine = {r["_offset"]: r for r in lake.rows(config.quarantine.path)}
    assert set(quarantine) == {4, 5}
    assert quarantine[4]["_failed_expectations"] == ["expect_column_values_to_be_between(amount)"]
    assert "not Avro" in quarantine[5]["_decode_error"] and bytes(quarantine[5]["payload"]) == b"\x01"


def test_three_partition_topic_with_an_inline_schema(lake):
    base = f"/default/{lake.unique_name('parts')}"
    partitions = [lake.topic(f"{base}-part-{k}") for k in range(3)]
    for k, builder in enumerate(partitions):
        builder.append(4 + k, payload=lambda o, k=k: order(o, order_id=f"p{k}-{o}"))
    partitions[1].upload()
    inline = json.dumps(ORDER_SCHEMA)
    config = lake.config([base], decode={"format": "json", "inline_schema": inline}, rules=None)

    lake.run(config)

    target = lake.rows(config.target.path)
    expected = {(b.name, o) for k, b in enumerate(partitions) for o in range(4 + k)}
    assert ids(target) == expected
    assert {r["order_id"] for r in target} == {f"p{t[-1]}-{o}" for t, o in expected}
    assert {r["_partition"] for r in target} == {0, 1, 2}
    assert [lake.cursor(b.name, config.source.subscription) for b in partitions] == [3, 4, 5]


@pytest.mark.parametrize("versions", [1, 2, PLANNED_VERSIONS + 1],
                         ids=["one-version", "planned-from-registry", "listed-by-a-job"])
def test_messages_naming_a_version_the_subject_lacks_are_quarantined_naming_it(lake, versions):
    """A subject of one version is decoded in one projection; one of few versions with a part per
    registered version planned from the registry; one of many, with the versions a batch names
    found by a Spark job. Each way
    every message decodes with the version it names, and one naming a version that does not
    exist goes to quarantine with a reason naming that version."""
    subject, schema_id = lake.subject()
    for v in range(2, versions + 1):
        extra = {**ORDER_SCHEMA["properties"], **{f"field{n}": {"type": "string"} for n in range(2, v + 1)}}
        assert register_schema(lake.metadata, subject, "JsonSchema",
                               json.dumps({**ORDER_SCHEMA, "properties": extra})) == (schema_id, v)
    topic = lake.topic(f"/default/{lake.unique_name('versions')}", schema=(schema_id, versions))
    topic.append(3, payload=lambda o: order(o, **{f"field{versions}": f"f{o}"} if versions > 1 else {}))
    topic.schema = (schema_id, 1)
    topic.append(2, payload=lambda o: order(o))
    topic.schema = (schema_id, 99)
    topic.append(2, payload=lambda o: order(o))
    config = lake.config([topic.name], decode={"format": "json", "subject": subject}, rules=None)

    lake.run(config)

    target = {r["_offset"]: r for r in lake.rows(config.target.path)}
    assert sorted(target) == [0, 1, 2, 3, 4]
    assert [target[o]["_schema_version"] for o in range(5)] == [versions] * 3 + [1] * 2
    if versions > 1:
        assert [target[o][f"field{versions}"] for o in range(5)] == ["f0", "f1", "f2", None, None]
    assert all(target[o]["_rescued_data"] is None for o in range(5))
    quarantine = {r["_offset"]: r["_decode_error"] for r in lake.rows(config.quarantine.path)}
    assert sorted(quarantine) == [5, 6]
    for reason in quarantine.values():
        assert f"subject {subject!r} version 99 cannot be loaded" in reason, reason
