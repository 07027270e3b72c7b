"""Every notebook in `notebooks/` runs, cell by cell, against the test rig, and shows the right thing.

One partitioned topic is built once for the module in the real broker's layout (real etcd, moto
S3 for objects, local WAL files): partition 0 has objects plus a WAL tail, partition 1 is fully
uploaded and sealed (unloaded). Its JSON orders include payloads that fail an expectation and
one that is not JSON. The ingest notebook runs the pipeline once; the data-quality and history
notebooks then look at what it wrote. Widgets get the rig's endpoints; everything else is the
notebooks' own defaults, as a Databricks user would start.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from connectors.cursor_commit import CursorWriter
from connectors.spark_compat import ADMISSION_CONTROL
from danube_core.frames import FRAME_HEADER_SIZE
from danube_core.message import encode_message
from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.objectstore import ObjectStore
from tests.notebook_runner import NotebookCellError, parse_notebook, run_notebook
from tests.topic_builder import BASE_PUBLISH_MS, TopicBuilder

pytestmark = pytest.mark.spark

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
HELPERS = {"notebook_widgets.py"}  # plain modules beside the notebooks, which import them
LOCAL_PATH_HINTS = ("/tmp", "./danube-data", "127.0.0.1", "localhost", "file://")
SPACING_MS = 1000  # publish_time step between offsets
BAD_AMOUNT_EVERY = 10  # offsets 10, 20, ...: amount < 0 fails expect_column_values_to_be_between
NOT_JSON_OFFSET = 7  # partition 0 only: fails decoding
ANALYTICS_NEXT = {0: 25, 1: 40}  # "analytics" subscription: next offset per partition


def order_payload(partition: int, offset: int) -> bytes:
    if partition == 0 and offset == NOT_JSON_OFFSET:
        return b"not json at all"
    amount = -5.0 if offset and offset % BAD_AMOUNT_EVERY == 0 else 10.0 + offset
    return json.dumps({"order_id": f"o-{partition}-{offset}", "amount": amount, "currency": "EUR"}).encode()


def verdict(partition: int, offset: int) -> str:
    """How the notebook's default pipeline must judge a message: decode | expectation | valid."""
    if partition == 0 and offset == NOT_JSON_OFFSET:
        return "decode"
    return "expectation" if offset and offset % BAD_AMOUNT_EVERY == 0 else "valid"


@dataclass
class Rig:
    namespace: str
    base: str  # /ns/orders
    partitions: list[str]
    messages: dict[str, dict[int, object]]  # partition name -> offset -> StreamMessage
    source_widgets: dict[str, str]
    delta_root: Path
    latest: dict[str, int]  # end-exclusive
    brokers: list[int]  # broker id per partition (random u64s, as brokers pick them)


@pytest.fixture(scope="module")
def rig(etcd_endpoint, moto_s3, tmp_path_factory) -> Rig:
    suffix = uuid.uuid4().hex[:8]
    namespace, bucket = f"nb{suffix}", f"nb-bucket-{suffix}"
    moto_s3.create_bucket(bucket)
    store = ObjectStore(f"s3://{bucket}", moto_s3.storage_options)
    wal_root = tmp_path_factory.mktemp("wal")
    base = f"/{namespace}/orders"
    with EtcdMetadataStore(etcd_endpoint) as metadata:
        builders = [
            TopicBuilder(metadata, store, str(wal_root), f"{base}-part-{k}") for k in (0, 1)
        ]
        for k, builder in enumerate(builders):
            def payload(offset: int, k: int = k) -> bytes:
                return order_payload(k, offset)

            def published(offset: int) -> int:
                return BASE_PUBLISH_MS + offset * SPACING_MS

            builder.append(40 if k == 0 else 30, payload=payload, publish_time=published)
            builder.upload()
            builder.append(20 if k == 0 else 10, payload=payload, publish_time=published)
        builders[1].upload()
        builders[1].seal()
        names = [str(b.topic) for b in builders]
        CursorWriter(metadata, "analytics").commit({names[k]: ANALYTICS_NEXT[k] for k in (0, 1)})
        messages = {str(b.topic): dict(b.messages) for b in builders}
        brokers = [b.broker_id for b in builders]
    return Rig(
        namespace=namespace,
        base=base,
        partitions=names,
        messages=messages,
        source_widgets={
            "etcd_endpoints": etcd_endpoint,
            "storage_url": f"s3://{bucket}",
            "storage_options": json.dumps(moto_s3.storage_options),
        },
        delta_root=tmp_path_factory.mktemp("delta"),
        latest={name: max(msgs) + 1 for name, msgs in messages.items()},
        brokers=brokers,
    )


def shown(run, index: int) -> list[dict]:
    frames = run.display.frames()
    assert len(frames) > index, f"{run.path.name} displayed only {len(frames)} tables"
    return frames[index].value


# ---- the runner itself ---------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(p for p in NOTEBOOKS.glob("*.py") if p.name not in HELPERS), ids=lambda p: p.name)
def test_every_notebook_is_in_databricks_source_format(path: Path) -> None:
    cells = parse_notebook(path.read_text(encoding="utf-8"), path.name)
    assert cells[0].magic, "a notebook opens with a markdown cell saying what it does"
    code = [line for c in cells if not c.magic for line in c.source.splitlines()]
    assert any(line.startswith("dbutils.widgets.") for line in code), "parameters are widgets"
    baked = [line for line in code if any(p in line for p in LOCAL_PATH_HINTS) and "dbutils.widgets." not in line]
    assert not baked, f"local paths outside widget defaults: {baked}"


BROKEN = (
    "# Databricks notebook source\n# MAGIC %md\n# MAGIC # Broken\n\n# COMMAND ----------\n\n"
    "dbutils.widgets.text('x', '1')\n\n# COMMAND ----------\n\nraise RuntimeError('boom ' + dbutils.widgets.get('x'))\n"
)


def test_a_failing_cell_is_reported_with_its_number(tmp_path: Path) -> None:
    notebook = tmp_path / "broken.py"
    notebook.write_text(BROKEN)
    with pytest.raises(NotebookCellError, match=r"broken.py: cell 3 .*boom 2"):
        run_notebook(notebook, None, {"x": "2"})


def test_a_widget_the_notebook_never_declares_is_a_test_error(tmp_path: Path) -> None:
    notebook = tmp_path / "quiet.py"
    notebook.write_text(BROKEN.rsplit("# COMMAND", 1)[0])
    with pytest.raises(NotebookCellError, match=r"never declares: \['y'\]"):
        run_notebook(notebook, None, {"y": "2"})


# ---- 01: explore a topic ---------------------------------------------------------------------


def test_explore_topic_lists_partitions_reads_a_range_and_measures_lag(rig: Rig, spark) -> None:
    run = run_notebook(NOTEBOOKS / "01_explore_topic.py", spark, {
        **rig.source_widgets,
        "namespace": rig.namespace,
        "topic": rig.base,
        "starting_offset": "5",
        "ending_offset": "35",
    })
    p0, p1 = rig.partitions

    topics = {r["topic"]: r for r in shown(run, 0)}
    assert sorted(topics) == [p0, p1]
    assert topics[p0]["latest_offset"] == 60 and topics[p0]["objects"] == 1 and not topics[p0]["sealed"]
    assert topics[p0]["last_object_offset"] == 39 and topics[p0]["owner_broker"] == str(rig.brokers[0])
    assert topics[p1]["sealed"] and topics[p1]["sealed_offset"] == 39 and topics[p1]["owner_broker"] is None
    assert topics[p1]["objects"] == 2 and topics[p1]["subscriptions"] == 1

    descriptors = shown(run, 1)
    assert [(d["topic"], d["start_offset"], d["end_offset"]) for d in descriptors] == [
        (p0, 0, 39), (p1, 0, 29), (p1, 30, 39)]
    assert [(s["topic"], s["last_committed_offset"]) for s in shown(run, 2)] == [(p1, 39)]

    summary = {r["partition"]: r for r in shown(run, 3)}
    assert summary[0]["messages"] == 30 and (summary[0]["first_offset"], summary[0]["last_offset"]) == (5, 34)
    assert summary[1]["messages"] == 30 and (summary[1]["first_offset"], summary[1]["last_offset"]) == (5, 34)
    assert len(summary[0]["sources"]) == 1 and summary[0]["sources"][0].startswith("data-0-")
    sample = shown(run, 4)
    assert len(sample) == 20 and sample[0]["offset"] == 5
    assert sample[0]["payload_text"] == rig.messages[p0][5].payload.decode()

    lag = {(r["subscription"], r["topic"]): r for r in shown(run, 5)}
    expected_ms = (rig.latest[p0] - ANALYTICS_NEXT[0]) * SPACING_MS
    assert lag[("analytics", p0)]["messages"] == rig.latest[p0] - ANALYTICS_NEXT[0]
    assert lag[("analytics", p0)]["ms"] == expected_ms
    # What a reader would fetch: the object from its index entry at or below the cursor (offset 0,
    # the only one), then the WAL tail, frame headers included.
    assert lag[("analytics", p0)]["bytes"] == sum(
        FRAME_HEADER_SIZE + len(encode_message(m)) for m in rig.messages[p0].values())
    assert lag[("analytics", p1)]["messages"] == 0
    assert len(run.display.figures()) == 1


# ---- 02: ingest to Delta ---------------------------------------------------------------------

PIPELINE = "orders_notebook"  # the notebook's default pipeline name
SUBSCRIPTION = "orders-notebook"  # the notebook's default subscription


def expected(rig: Rig, kind: str) -> set[tuple[str, int]]:
    return {(name, offset) for k, name in enumerate(rig.partitions) for offset in rig.messages[name]
            if verdict(k, offset) == kind}


@pytest.fixture(scope="module")
def ingested(rig: Rig, spark):
    """The ingest notebook, run once with the notebook's own pipeline defaults on the rig's topic."""
    return run_notebook(NOTEBOOKS / "02_ingest_to_delta.py", spark, {
        **rig.source_widgets,
        "topics": rig.base,
        # Several batches where Spark can cap them (4.2+); Spark 4.0/4.1 refuse a cap.
        "max_messages_per_trigger": "50" if ADMISSION_CONTROL else "",
        "delta_root": str(rig.delta_root),
        "trigger_interval": "500 milliseconds",
        "poll_interval_s": "1",
        "watch_timeout_s": "240",
    })


def table(rig: Rig, spark, suffix: str = ""):
    return spark.read.format("delta").load(str(rig.delta_root / f"{PIPELINE}{suffix}"))


def test_ingest_runs_the_pipeline_until_the_lag_is_gone_then_stops_it(rig: Rig, spark, ingested) -> None:
    valid, bad = expected(rig, "valid"), expected(rig, "decode") | expected(rig, "expectation")
    assert not ingested.namespace["query"].isActive

    summary = shown(ingested, 4)[0]
    assert (summary["rows"], summary["valid"], summary["quarantined"]) == (len(valid) + len(bad), len(valid), len(bad))
    assert (summary["target_rows"], summary["quarantine_rows"]) == (len(valid), len(bad))
    assert {(r["_topic"], r["_offset"]) for r in table(rig, spark).select("_topic", "_offset").collect()} == valid

    final_lag = {r["topic"]: r for r in shown(ingested, 3)}
    assert {t: (r["cursor"], r["messages"]) for t, r in final_lag.items()} == {
        t: (rig.latest[t] - 1, 0) for t in rig.partitions}

    watch = shown(ingested, 1)
    assert watch[-1]["lag_messages"] == 0 and watch[-1]["rows"] == len(valid) + len(bad)
    assert [s["rows"] for s in watch] == sorted(s["rows"] for s in watch)
    progress = shown(ingested, 2)
    if ADMISSION_CONTROL:
        assert len(progress) >= 2, "50 messages per trigger over 100 messages"
    assert sum(p["input_rows"] for p in progress) == len(valid) + len(bad)
    assert all(p["processed_rows_per_s"] > 0 for p in progress)
    assert len(ingested.display.figures()) == 1


def test_ingest_from_a_pipeline_file_with_available_now(rig: Rig, spark, tmp_path: Path) -> None:
    import yaml

    delta = tmp_path / "delta"
    pipeline = {
        "name": "orders_raw",
        "source": {
            "etcd_endpoints": rig.source_widgets["etcd_endpoints"],
            "storage_url": rig.source_widgets["storage_url"],
            "storage_options": json.loads(rig.source_widgets["storage_options"]),
            "topics": [rig.base],
            "subscription": "orders-raw",
            "starting_offsets": "earliest",
        },
        "decode": {"format": "raw"},
        "target": {"path": str(delta / "orders_raw")},
        "quarantine": {"path": str(delta / "orders_raw_quarantine")},
        "trigger": {"mode": "availableNow"},
        "checkpoint": str(delta / "_checkpoints" / "orders_raw"),
    }
    file = tmp_path / "orders_raw.yaml"
    file.write_text(yaml.safe_dump(pipeline), encoding="utf-8")

    run = run_notebook(NOTEBOOKS / "02_ingest_to_delta.py", spark, {"pipeline_file": str(file), "poll_interval_s": "0.5"})
    total = sum(len(m) for m in rig.messages.values())
    assert shown(run, 0)[0]["trigger"] == "availableNow" and shown(run, 0)[0]["subscription"] == "orders-raw"
    summary = shown(run, 4)[0]
    assert (summary["rows"], summary["valid"], summary["quarantined"], summary["target_rows"]) == (total, total, 0, total)
    assert {r["topic"]: r["cursor"] for r in shown(run, 3)} == {t: rig.latest[t] - 1 for t in rig.partitions}


# ---- 03: data quality review -------------------------------------------------------------------


def test_data_quality_review_groups_the_quarantine_by_failed_expectation(rig: Rig, spark, ingested) -> None:
    root = rig.delta_root
    run = run_notebook(NOTEBOOKS / "03_data_quality_review.py", spark, {
        "results_table": str(root / f"{PIPELINE}_quality"),
        "quarantine_table": str(root / f"{PIPELINE}_quarantine"),
        "target_table": str(root / PIPELINE),
    })
    failing = expected(rig, "expectation")
    batches = sorted(r["batch_id"] for r in shown(ingested, 2))  # every batch read rows

    per_batch = shown(run, 0)
    assert [r["batch_id"] for r in per_batch] == batches
    assert sum(r["unexpected_rows"] for r in per_batch) == len(failing)
    assert all(r["expectations"] == 2 for r in per_batch)

    by_reason = {r["reason"]: r["records"] for r in shown(run, 2)}
    decode_reasons = [k for k in by_reason if k.startswith("decode: ")]
    assert by_reason.pop("expect_column_values_to_be_between(amount)") == len(failing)
    assert len(decode_reasons) == 1 and by_reason == {decode_reasons[0]: 1}

    sample = shown(run, 3)
    assert len(sample) == len(failing) + 1
    assert (sample[0]["_topic"], sample[0]["_offset"], sample[0]["payload_text"]) == (
        rig.partitions[0], NOT_JSON_OFFSET, "not json at all")
    assert sample[1]["_failed_expectations"] == ["expect_column_values_to_be_between(amount)"]
    assert shown(run, 4)[0]["quarantined_rows"] == len(failing) + 1
    assert len(run.display.figures()) == 1


# ---- 04: topic history -------------------------------------------------------------------------


def test_topic_history_reconciles_every_version_and_a_time_window(rig: Rig, spark, ingested) -> None:
    window = (10, 30)  # offsets by publish time, both partitions
    run = run_notebook(NOTEBOOKS / "04_topic_history.py", spark, {
        **rig.source_widgets,
        "topic": rig.base,
        "target_path": str(rig.delta_root / PIPELINE),
        "quarantine_path": str(rig.delta_root / f"{PIPELINE}_quarantine"),
        "starting_timestamp": str(BASE_PUBLISH_MS + window[0] * SPACING_MS),
        "ending_timestamp": str(BASE_PUBLISH_MS + window[1] * SPACING_MS),
    })
    valid, bad = expected(rig, "valid"), expected(rig, "decode") | expected(rig, "expectation")

    history = shown(run, 0)
    assert [h["version"] for h in history] == list(range(len(history)))
    assert json.loads(history[-1]["covered_to"]) == rig.latest

    reconciled = shown(run, 1)
    assert len(reconciled) == len(history)
    assert all(r["unaccounted"] == 0 for r in reconciled), reconciled
    assert (reconciled[-1]["topic_messages"], reconciled[-1]["table_rows"], reconciled[-1]["quarantined"]) == (
        len(valid) + len(bad), len(valid), len(bad))

    in_window = {(t, o) for t in rig.partitions for o in range(*window)}
    compare = {r["source"].split("@")[0]: r for r in shown(run, 2)}
    assert compare["topic"]["rows"] == len(in_window)
    assert (compare["topic"]["first_offset"], compare["topic"]["last_offset"]) == (window[0], window[1] - 1)
    assert compare["table"]["rows"] == len(in_window & valid)
    assert compare["quarantine"]["rows"] == len(in_window & bad)
    assert shown(run, 3) == []
    assert len(run.display.figures()) == 1


# ---- the speed layer next to Spark -----------------------------------------------------------


def test_speed_layer_notebook_admits_a_table_and_answers_like_spark(spark, tmp_path_factory) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    from tests.rig import eventually
    from devstack.speedlayer_cluster import SpeedLayerCluster

    root = tmp_path_factory.mktemp("speedlayer-notebook")
    path = str(root / "orders")
    currencies = ["EUR", "USD", "GBP"]
    orders = pa.table({"order_id": [f"o-{i:04d}" for i in range(600)],
                       "amount": [float(i % 50) for i in range(600)],
                       "currency": [currencies[i % 3] for i in range(600)]})
    write_deltalake(path, orders)
    cluster = SpeedLayerCluster(root / "cluster")
    try:
        cluster.start_master("m1")
        cluster.start_worker("demo", "w1")
        gateway = cluster.start_gateway()
        client = cluster.client()
        eventually(lambda: len(client.workers("demo").workers) == 1, deadline_s=60)
        run = run_notebook(NOTEBOOKS / "05_speed_layer_query.py", spark, {
            "gateway": gateway, "masters": ",".join(cluster.master_addresses), "table_path": path, "runs": "3"})
    finally:
        cluster.stop()
    admitted = shown(run, 0)[0]
    assert admitted["status"] == "ASSIGNED" and admitted["ready_on"] == "w1"
    expected = [{"currency": c, "orders": 200, "amount": float(sum(i % 50 for i in range(600) if i % 3 == k))}
                for k, c in sorted(enumerate(currencies), key=lambda kc: kc[1])]
    assert shown(run, 1) == expected  # through the gateway
    assert shown(run, 2) == expected  # Spark on the table's files
    assert shown(run, 3) == [{"same_answer": True, "rows": 3}]
    latency = {r["engine"]: r for r in shown(run, 4)}
    assert set(latency) == {"speed layer (gateway)", "Spark uncached", "Spark cached"}
    assert all(r["runs"] == 3 and r["p50_ms"] > 0 for r in latency.values())
    assert len(run.display.figures()) == 1
