"""Pipelines in the session's Spark: JSON from the registry, great-expectations, quarantine, replay.

Topics are built in the broker's layout (`tests.topic_builder`) on local files with the
session's etcd, so these run in-process with the shared `spark` fixture. The `lake` fixture and
the helpers are shared with the other `test_pipeline_*` modules.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from danube_core.keys import cursor_key
from danube_core.metadata import MetadataStore
from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.objectstore import ObjectStore
from danube_core.records import parse_cursor
from danube_core.schema_registry import register_schema
from pipelines.config import PipelineConfig, parse_config
from pipelines.runner import OBSERVED_INPUT, PipelineRunner
from tests.topic_builder import TopicBuilder

pytestmark = pytest.mark.spark

ORDER_SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"}, "currency": {"type": "string"}},
    "required": ["order_id"],
}
ORDER_RULES = [
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "amount"}},
    {"type": "expect_column_values_to_be_between", "kwargs": {"column": "amount", "min_value": 0}},
    {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "currency", "value_set": ["EUR", "USD"]}},
]


class SchemaTopic(TopicBuilder):
    """A TopicBuilder whose messages carry `schema` = (schema_id, schema_version)."""

    schema: tuple[int | None, int | None] = (None, None)

    def _message(self, offset, payload, attributes, publish_time):
        msg = super()._message(offset, payload, attributes, publish_time)
        return dataclasses.replace(msg, schema_id=self.schema[0], schema_version=self.schema[1])


@dataclass
class Lake:
    """One test's topics (local WAL + objects, session etcd) and Delta folders."""

    spark: Any
    metadata: MetadataStore
    store: ObjectStore
    root: Path
    etcd_endpoint: str
    unique_name: Callable[[str], str]

    def topic(self, name: str, schema: tuple[int | None, int | None] = (None, None)) -> SchemaTopic:
        builder = SchemaTopic(self.metadata, self.store, str(self.root / "wal"), name, broker_id=random.getrandbits(63))
        builder.schema = schema
        return builder

    def subject(self, schema: dict = ORDER_SCHEMA, kind: str = "JsonSchema") -> tuple[str, int]:
        name = self.unique_name("subject")
        schema_id, _ = register_schema(self.metadata, name, kind, json.dumps(schema))
        return name, schema_id

    def config(self, topics: list[str], *, decode: dict, rules: list | None = ORDER_RULES,
               trigger: dict | None = None, **source: Any) -> PipelineConfig:
        name = self.unique_name("pipe")
        data = {
            "name": name,
            "source": {"etcd_endpoints": self.etcd_endpoint, "storage_url": self.store.url, "topics": topics,
                       "subscription": name, "starting_offsets": "earliest", **source},
            "decode": decode,
            "target": {"path": str(self.root / name / "target")},
            "quarantine": {"path": str(self.root / name / "quarantine")},
            "checkpoint": str(self.root / name / "checkpoint"),
            "trigger": trigger or {"mode": "availableNow"},
        }
        if rules:
            data["expectations"] = {"suite": name, "rules": rules}
        return parse_config(data, f"<{name}>")

    def run(self, config: PipelineConfig) -> PipelineRunner:
        runner = PipelineRunner(config, self.spark)
        try:
            runner.run()
        finally:
            runner.stop()
        return runner

    def rows(self, path: str) -> list:
        return self.spark.read.format("delta").load(path).collect()

    def count(self, path: str) -> int:
        """Rows in a Delta table, 0 while the pipeline has not created it yet."""
        from delta.tables import DeltaTable

        return self.spark.read.format("delta").load(path).count() if DeltaTable.isDeltaTable(self.spark, path) else 0

    def cursor(self, topic: str, subscription: str) -> int | None:
        raw = self.metadata.get(cursor_key(topic, subscription))
        return None if raw is None else parse_cursor(raw, topic)


@pytest.fixture
def lake(spark, etcd_endpoint, tmp_path, unique_name):
    metadata = EtcdMetadataStore(etcd_endpoint)
    yield Lake(spark, metadata, ObjectStore(str(tmp_path / "objects")), tmp_path, etcd_endpoint, unique_name)
    metadata.close()


def ids(rows) -> set[tuple[str, int]]:
    keys = [(r["_topic"], r["_offset"]) for r in rows]
    assert len(keys) == len(set(keys)), "duplicate (topic, offset) rows"
    return set(keys)


def order(i: int, **changes: Any) -> bytes:
    return json.dumps({"order_id": f"o{i}", "amount": float(i), "currency": "EUR", **changes}).encode()


# Offsets whose payload is broken, and why: a decode failure or the expectations it fails.
BROKEN = {
    3: (b"{not json", "decode"),
    7: (order(7, amount=-1.0), "expect_column_values_to_be_between(amount)"),
    11: (json.dumps({"amount": 2.0, "currency": "EUR"}).encode(), "decode"),  # required order_id missing
    13: (order(13, currency="XXX", amount=-2.0),
         "expect_column_values_to_be_between(amount)|expect_column_values_to_be_in_set(currency)"),
}


def payload(offset: int) -> bytes:
    return BROKEN[offset][0] if offset in BROKEN else order(offset, note="extra")


def test_json_pipeline_splits_valid_and_failing_rows_exactly(lake):
    subject, _ = lake.subject()
    topic = lake.topic(f"/default/{lake.unique_name('orders')}")
    topic.append(20, payload=payload)
    topic.upload()
    topic.append(5, payload=payload)  # offsets 20..24 only in the WAL
    config = lake.config([topic.name], decode={"format": "json", "subject": subject})

    runner = lake.run(config)

    target, quarantine = lake.rows(config.target.path), lake.rows(config.quarantine.path)
    assert ids(target) == {(topic.name, o) for o in range(25) if o not in BROKEN}
    assert ids(quarantine) == {(topic.name, o) for o in BROKEN}
    reasons = {r["_offset"]: ("decode" if r["_decode_error"] else "|".join(sorted(r["_failed_expectations"])))
               for r in quarantine}
    assert reasons == {o: why for o, (_, why) in BROKEN.items()}
    assert {bytes(r["payload"]) for r in quarantine} == {p for p, _ in BROKEN.values()}
    first = min(target, key=lambda r: r["_offset"])
    assert (first["order_id"], first["amount"], first["currency"]) == ("o0", 0.0, "EUR")
    assert json.loads(first["_rescued_data"]) == {"note": "extra"}
    assert lake.cursor(topic.name, config.source.subscription) == 24
    totals = runner.metrics.totals()
    assert (totals["rows"], totals["valid"], totals["quarantined"]) == (25, 21, 4)
    history = lake.spark.sql(f"DESCRIBE HISTORY delta.`{config.target.path}`").collect()
    meta = json.loads(history[0]["userMetadata"])
    assert meta["offsets"] == {topic.name: {"start": 0, "end": 25}}
    assert meta["objects"] == sorted({d.object_id for d in topic.descriptors} | {"wal"})
    by_reason = meta["counts"].pop("quarantine_by_reason")
    assert meta["counts"] == {"rows": 25, "target": 21, "quarantine": 4}
    # rows quarantined by reason (what the console's pipeline page shows): "decode", or the
    # expectations a row failed, joined with " & "
    quarantined_for = Counter("decode" if r["_decode_error"] else " & ".join(sorted(r["_failed_expectations"]))
                              for r in quarantine)
    assert {" & ".join(sorted(k.split(" & "))): n for k, n in by_reason.items()} == dict(quarantined_for)
    observed = [p.observedMetrics[OBSERVED_INPUT] for p in runner.query.recentProgress if p.numInputRows]
    assert sum(m["rows_in"] for m in observed) == 25
    assert sum(m["payload_bytes_in"] for m in observed) == sum(len(payload(o)) for o in range(25))


def test_a_replayed_batch_adds_nothing_and_the_cursor_follows_delta(lake):
    from pipelines.decode import Decoder
    from pipelines.delta_sink import DeltaBatchWriter
    from pipelines.expectations import QualityGate
    from pipelines.metrics import PipelineMetrics
    from pipelines.runner import reader_options

    subject, _ = lake.subject()
    topic = lake.topic(f"/default/{lake.unique_name('replay')}")
    topic.append(15, payload=payload)
    config = lake.config([topic.name], decode={"format": "json", "subject": subject})
    from pipelines.subject_schemas import SubjectSchemas

    options = reader_options(config.source)
    writer = DeltaBatchWriter(config, Decoder(config.decode, SubjectSchemas(lake.metadata, subject)),
                              QualityGate(config.expectations), options, lake.metadata, PipelineMetrics())
    batch = lake.spark.read.format("danube").options(**options).load()

    writer(batch, 0)
    before = (len(lake.rows(config.target.path)), len(lake.rows(config.quarantine.path)))
    writer(batch, 0)  # the same batch id again, as Spark replays it after a crash

    assert (len(lake.rows(config.target.path)), len(lake.rows(config.quarantine.path))) == before == (11, 4)
    versions = lake.spark.sql(f"DESCRIBE HISTORY delta.`{config.target.path}`").count()
    assert versions == 1
    assert lake.cursor(topic.name, config.source.subscription) == 14
