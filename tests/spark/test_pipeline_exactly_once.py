"""Exactly once under every fault: a lost or replaced checkpoint, a crash between the target and
the quarantine write with the suite and the latest schema changed before the replay, and
offsets skipped under failOnDataLoss=false counted by the sink.

Uses the `lake` fixture and helpers of `test_pipeline_decode`.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from danube_core.errors import CheckpointMismatchError
from danube_core.schema_registry import SchemaRegistry, register_schema
from pipelines.decode import Decoder
from pipelines.delta_sink import DeltaBatchWriter
from pipelines.expectations import QualityGate
from pipelines.metrics import PipelineMetrics
from pipelines.runner import reader_options
from pipelines.subject_schemas import SubjectSchemas
from tests.spark.test_pipeline_decode import BROKEN, ORDER_SCHEMA, ids, lake, order, payload  # noqa: F401 (fixture)
from tests.topic_builder import PAYLOAD_OFFSET_IN_FRAME, corrupt_byte

pytestmark = pytest.mark.spark

RAW = {"format": "raw"}


def writer_for(lake, config) -> DeltaBatchWriter:
    """The sink a runner would build for `config`, for calling it directly with a batch id."""
    schemas = SubjectSchemas(lake.metadata, config.decode.subject) if config.decode.subject else None
    gate = QualityGate(config.expectations) if config.expectations else None
    return DeltaBatchWriter(config, Decoder(config.decode, schemas), gate, reader_options(config.source),
                            lake.metadata, PipelineMetrics())


def batch_of(lake, config):
    return lake.spark.read.format("danube").options(**reader_options(config.source)).load()


def test_a_deleted_checkpoint_is_refused_instead_of_skipping_rows(lake):
    topic = lake.topic(f"/default/{lake.unique_name('deleted')}")
    topic.append(6)
    config = lake.config([topic.name], decode=RAW, rules=None)
    lake.run(config)
    assert lake.count(config.target.path) == 6
    shutil.rmtree(config.checkpoint)
    topic.append(4)

    with pytest.raises(CheckpointMismatchError) as refused:
        lake.run(config)  # batch ids would restart at 0 and Delta would skip them all

    message = str(refused.value)
    for part in (config.target.path, repr(config.name), config.checkpoint, "is new", "restore",
                 "new name", json.dumps({topic.name: 6})):
        assert part in message
    # The sink refuses on its own too (a checkpoint lost after the runner's check).
    with pytest.raises(CheckpointMismatchError, match="written .batch 0. under checkpoint id"):
        writer_for(lake, config)(batch_of(lake, config), 0)
    assert lake.count(config.target.path) == 6
    assert lake.cursor(topic.name, config.source.subscription) == 5


def test_a_checkpoint_replaced_by_an_older_copy_is_refused(lake):
    topic = lake.topic(f"/default/{lake.unique_name('replaced')}")
    topic.append(5, payload=payload)
    config = lake.config([topic.name], decode={"format": "json", "inline_schema": json.dumps(ORDER_SCHEMA)})
    lake.run(config)  # batch 0: the quarantine table gets offset 3
    backup = lake.root / "checkpoint-backup"
    shutil.copytree(config.checkpoint, backup)
    topic.append(10, payload=payload)
    lake.run(config)  # batch 1
    shutil.rmtree(config.checkpoint)
    shutil.copytree(backup, config.checkpoint)  # the checkpoint restored from yesterday's copy
    topic.append(3, payload=payload)

    with pytest.raises(CheckpointMismatchError) as refused:
        lake.run(config)  # batch 1 again, with other offsets: Delta would skip it

    assert "holds batches up to 1" in str(refused.value) and "knows batches up to 0" in str(refused.value)
    assert ids(lake.rows(config.target.path)) | ids(lake.rows(config.quarantine.path)) == \
        {(topic.name, o) for o in range(15)}


def test_a_replay_after_a_crash_between_the_writes_splits_as_the_first_attempt(lake, monkeypatch):
    subject, _ = lake.subject()
    topic = lake.topic(f"/default/{lake.unique_name('split')}")  # messages name no schema version
    topic.append(15, payload=payload)
    config = lake.config([topic.name], decode={"format": "json", "subject": subject})
    first = writer_for(lake, config)
    write = first._write

    def crash_before_quarantine(rows, table, *args, **kwargs):
        if table == config.quarantine:
            raise RuntimeError("driver killed between the target and the quarantine write")
        return write(rows, table, *args, **kwargs)

    monkeypatch.setattr(first, "_write", crash_before_quarantine)
    with pytest.raises(RuntimeError, match="driver killed"):
        first(batch_of(lake, config), 0)
    assert lake.count(config.quarantine.path) == 0 and lake.count(config.target.path) == 11
    # Before the replay: a latest version every payload fails, and a suite without rules.
    coupon = {**ORDER_SCHEMA["properties"], "coupon": {"type": "string"}}
    strict = {**ORDER_SCHEMA, "properties": coupon, "required": ["order_id", "coupon"]}
    SchemaRegistry(lake.metadata).set_mode(subject, "none")
    register_schema(lake.metadata, subject, "JsonSchema", json.dumps(strict))
    changed = dataclasses.replace(config, expectations=None)
    replay = writer_for(lake, changed)

    replay(batch_of(lake, changed), 0)

    target, quarantine = ids(lake.rows(config.target.path)), ids(lake.rows(config.quarantine.path))
    assert not target & quarantine, "a row in both tables"
    assert target | quarantine == {(topic.name, o) for o in range(15)}, "a row in neither table"
    assert quarantine == {(topic.name, o) for o in BROKEN if o < 15}
    report = replay.metrics.reports[-1]
    assert report.replayed and (report.valid, report.quarantined) == (11, 4)
    # The next batch is a new one: it is split with today's settings (v2 fails every payload).
    topic.append(2, payload=payload)
    replay(batch_of(lake, changed).filter("offset >= 15"), 1)
    assert not replay.metrics.reports[-1].replayed
    assert ids(lake.rows(config.quarantine.path)) >= {(topic.name, 15), (topic.name, 16)}


def test_offsets_skipped_on_executors_are_counted(lake):
    topic = lake.topic(f"/default/{lake.unique_name('lossy')}")
    topic.append(10)
    topic.upload()
    topic.append(10)
    second = topic.upload()  # offsets 10..19
    topic.append(5)  # 20..24 only in the WAL
    _, first_frame = topic.frame_position(10)
    _, damaged = topic.frame_position(13)
    url = topic.object_url(second)
    corrupt_byte(url.removeprefix("file://"), damaged - first_frame + PAYLOAD_OFFSET_IN_FRAME)
    config = lake.config([topic.name], decode=RAW, rules=None, fail_on_data_loss=False)

    runner = lake.run(config)

    assert {r["_offset"] for r in lake.rows(config.target.path)} == set(range(13)) | set(range(20, 25))
    assert runner.metrics.totals()["lost"] == 7
    assert runner.metrics.lost_offsets() == {topic.name: 7}
    history = lake.spark.sql(f"DESCRIBE HISTORY delta.`{config.target.path}`").collect()
    assert json.loads(history[0]["userMetadata"])["lost"] == {topic.name: 7}
    assert lake.cursor(topic.name, config.source.subscription) == 24
