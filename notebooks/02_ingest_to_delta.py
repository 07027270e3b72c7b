# Databricks notebook source
# MAGIC %md
# MAGIC # Ingest a Danube topic into Delta
# MAGIC
# MAGIC Starts a pipeline (the same code as `python -m pipelines run <file>`), watches it catch up with the topic
# MAGIC and stops it. Each micro-batch decodes the payloads, runs the great-expectations suite, appends valid rows to
# MAGIC the target table and failing rows to the quarantine table (exactly once: Delta's idempotent writes keyed by
# MAGIC the batch id), and only then moves the subscription's cursor in etcd.
# MAGIC
# MAGIC Either name a pipeline file (`conf/pipelines/*.yaml`, uploaded to the workspace or DBFS) in `pipeline_file`,
# MAGIC or leave it empty and describe the pipeline with the widgets below: they are validated exactly like a file.
# MAGIC The watch ends when the subscription has no lag left (or after `watch_timeout_s`); then the query is stopped.

# COMMAND ----------

dbutils.widgets.text("pipeline_file", "", "pipeline YAML (empty: use the widgets)")
dbutils.widgets.text("name", "orders_notebook", "pipeline name")
dbutils.widgets.text("etcd_endpoints", "127.0.0.1:2379", "etcd endpoints")
dbutils.widgets.text("root_prefix", "/danube-data", "storage root prefix in etcd")
dbutils.widgets.text("storage_url", "./danube-data/cloud-storage", "storage URL")
dbutils.widgets.text("storage_options", "{}", "storage options (JSON)")
dbutils.widgets.text("wal_root", "auto", "WAL root (auto | none | URL)")
dbutils.widgets.text("topics", "/default/orders", "topics (comma-separated)")
dbutils.widgets.text("subscription", "orders-notebook", "subscription")
dbutils.widgets.text("starting_offsets", "earliest", "first run starts at")
dbutils.widgets.text("max_messages_per_trigger", "", "messages per micro-batch (empty: no cap; Spark 4.2+)")
dbutils.widgets.dropdown("decode_format", "json", ["raw", "json", "avro"], "payload format")
dbutils.widgets.text("schema_subject", "", "schema registry subject (empty: inline schema)")
dbutils.widgets.text(
    "inline_schema",
    '{"type": "object", "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"}, '
    '"currency": {"type": "string"}}, "required": ["order_id"]}',
    "inline JSON Schema / Avro schema",
)
dbutils.widgets.text(
    "expectations",
    '[{"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "order_id"}}, '
    '{"type": "expect_column_values_to_be_between", "kwargs": {"column": "amount", "min_value": 0}}]',
    "expectations (JSON list, empty: none)",
)
dbutils.widgets.text("delta_root", "/tmp/danube/delta", "Delta root (target, quarantine, checkpoint)")
dbutils.widgets.text("trigger_interval", "2 seconds", "trigger interval")
dbutils.widgets.text("watch_timeout_s", "300", "stop watching after (s)")
dbutils.widgets.text("poll_interval_s", "2", "poll every (s)")

# COMMAND ----------

import json
import time

import connectors
from connectors.offsets import SourceOffset
from connectors.topic_inspector import SubscriptionLag, TopicInspector, rows
from pipelines.config import load_config, parse_config
from pipelines.runner import PipelineRunner

connectors.register(spark)


def widget(name):
    return dbutils.widgets.get(name).strip()


def config_from_widgets():
    """The pipeline the widgets describe, as the YAML file would hold it."""
    root = widget("delta_root").rstrip("/")
    name = widget("name")
    expectations = json.loads(widget("expectations") or "[]")
    decode = {"format": widget("decode_format")}
    if decode["format"] != "raw":
        if widget("schema_subject"):
            decode["subject"] = widget("schema_subject")
        else:
            decode["inline_schema"] = widget("inline_schema")
    data = {
        "name": name,
        "source": {
            "etcd_endpoints": widget("etcd_endpoints"),
            "storage_url": widget("storage_url"),
            "storage_options": json.loads(widget("storage_options") or "{}"),
            "root_prefix": widget("root_prefix"),
            "wal_root": widget("wal_root"),
            "topics": [t.strip() for t in widget("topics").split(",") if t.strip()],
            "subscription": widget("subscription"),
            "starting_offsets": widget("starting_offsets"),
            "max_messages_per_trigger": int(cap) if (cap := widget("max_messages_per_trigger").strip()) else None,
        },
        "decode": decode,
        "target": {"path": f"{root}/{name}"},
        "quarantine": {"path": f"{root}/{name}_quarantine"},
        "trigger": {"mode": "processingTime", "interval": widget("trigger_interval")},
        "checkpoint": f"{root}/_checkpoints/{name}",
    }
    if expectations:
        data["expectations"] = {"suite": name, "rules": expectations, "results": {"path": f"{root}/{name}_quality"}}
    return parse_config(data, file="<notebook widgets>")


config = load_config(widget("pipeline_file")) if widget("pipeline_file") else config_from_widgets()


def location(table):
    return None if table is None else table.location


display(spark.createDataFrame(
    [(config.name, ",".join(config.source.topics) or config.source.topic_pattern or config.source.namespace,
      config.source.subscription, config.decode.format, location(config.target), location(config.quarantine),
      location(config.expectations.results if config.expectations else None), config.checkpoint, config.trigger.mode)],
    "pipeline string, topics string, subscription string, decode string, target string, quarantine string, "
    "quality_results string, checkpoint string, trigger string",
))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Start and watch
# MAGIC Every poll measures the subscription's lag from etcd and storage (messages, bytes and publish-time
# MAGIC milliseconds behind the newest message) and the rows the pipeline has committed so far. The lag stays empty
# MAGIC until the first batch has committed a cursor for every partition.

# COMMAND ----------

runner = PipelineRunner(config, spark)
query = runner.start()
inspector = TopicInspector.from_options(runner.options)
watch_timeout_s = float(widget("watch_timeout_s"))
poll_interval_s = float(widget("poll_interval_s"))

samples = []
started = time.monotonic()
while True:
    lag = inspector.lag(subscription=config.source.subscription)
    measured = bool(lag) and all(r.cursor is not None for r in lag)  # no cursor: no batch committed yet
    totals = runner.metrics.totals()
    samples.append({
        "elapsed_s": round(time.monotonic() - started, 2),
        "batches": totals["batches"],
        "rows": totals["rows"],
        "valid": totals["valid"],
        "quarantined": totals["quarantined"],
        "lag_messages": sum(r.messages for r in lag) if measured else None,
        "lag_bytes": sum(r.bytes or 0 for r in lag) if measured else None,
        "lag_ms": max(r.ms or 0 for r in lag) if measured else None,
    })
    caught_up = measured and samples[-1]["lag_messages"] == 0
    if caught_up or not query.isActive or samples[-1]["elapsed_s"] >= watch_timeout_s:
        break
    time.sleep(poll_interval_s)
# The pipeline commits the cursor inside its batch, so the lag reaches 0 a moment before Spark
# posts that batch's progress: wait for the progress of every row the pipeline wrote (the
# table below is read from it), within the same timeout.
while (query.isActive and time.monotonic() - started < watch_timeout_s
       and sum(p.numInputRows for p in query.recentProgress) < runner.metrics.totals()["rows"]):
    time.sleep(poll_interval_s)
failure = query.exception()
if failure is not None:
    runner.stop()
    raise RuntimeError(f"pipeline {config.name} failed: {failure}") from failure

watch_df = spark.createDataFrame(
    samples,
    "elapsed_s double, batches long, rows long, valid long, quarantined long, "
    "lag_messages long, lag_bytes long, lag_ms long",
)
display(watch_df)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Progress per micro-batch
# MAGIC From Spark's query progress: rows per second, batch duration, and the lag the `danube` source reported when it
# MAGIC planned the batch (its `latestOffset` carries the lag per topic partition).

# COMMAND ----------


def reported_lag(progress):
    """Messages behind, summed over the partitions, from the source's reported latest offset."""
    total = 0
    for source in progress.sources:
        try:
            offset = SourceOffset.from_json(source.latestOffset) if source.latestOffset else None
        except ValueError:
            continue
        total += sum(v.get("messages", 0) for v in (offset.lag if offset else {}).values())
    return total


progress_rows = [
    (p.batchId, p.timestamp, p.numInputRows, float(p.inputRowsPerSecond or 0.0),
     float(p.processedRowsPerSecond or 0.0), int(p.durationMs.get("triggerExecution", 0)), reported_lag(p))
    for p in query.recentProgress
    if p.numInputRows > 0
]
progress_df = spark.createDataFrame(
    progress_rows,
    "batch_id long, timestamp string, input_rows long, input_rows_per_s double, processed_rows_per_s double, "
    "trigger_ms long, lag_messages long",
)
display(progress_df.orderBy("batch_id"))

# COMMAND ----------

import matplotlib.pyplot as plt

fig, (throughput_ax, lag_ax) = plt.subplots(1, 2, figsize=(14, 4))
throughput_ax.bar([str(r[0]) for r in progress_rows], [r[4] for r in progress_rows], color="tab:blue")
throughput_ax.set_xlabel("micro-batch")
throughput_ax.set_ylabel("rows / s processed")
throughput_ax.set_title("Throughput")
measured_samples = [s for s in samples if s["lag_messages"] is not None]
lag_ax.plot([s["elapsed_s"] for s in measured_samples], [s["lag_messages"] for s in measured_samples],
            marker="o", color="tab:orange")
lag_ax.set_xlabel("seconds since start")
lag_ax.set_ylabel("messages behind")
lag_ax.set_title(f"Lag of subscription {config.source.subscription}")
fig.tight_layout()
display(fig)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Stop
# MAGIC Stopping is safe at any time: a batch that was cut short is replayed with the same id on the next start, and
# MAGIC Delta skips what that id already wrote. The cursors below are what etcd now holds for the subscription.

# COMMAND ----------

runner.stop()
final_lag = inspector.lag(subscription=config.source.subscription)
inspector.close()
totals = runner.metrics.totals()
display(spark.createDataFrame(rows(final_lag), SubscriptionLag.ddl()))


def table_count(table):
    reader = spark.read.format("delta")
    return (reader.load(table.path) if table.path is not None else spark.table(table.table)).count()


summary_df = spark.createDataFrame(
    [(config.name, totals["batches"], totals["rows"], totals["valid"], totals["quarantined"],
      table_count(config.target), table_count(config.quarantine) if totals["quarantined"] else 0)],
    "pipeline string, batches long, rows long, valid long, quarantined long, target_rows long, quarantine_rows long",
)
display(summary_df)
