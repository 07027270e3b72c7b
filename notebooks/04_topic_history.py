# Databricks notebook source
# MAGIC %md
# MAGIC # Topic history and Delta time travel
# MAGIC
# MAGIC Two ways to look back in time, side by side:
# MAGIC
# MAGIC * the topic itself, read by publish time with `startingTimestamp`/`endingTimestamp` (Danube keeps the history in
# MAGIC   sealed objects, so old messages are read straight from storage);
# MAGIC * the Delta table the pipeline fills, through `DESCRIBE HISTORY` and `versionAsOf`. Every pipeline commit records
# MAGIC   in its `userMetadata` which topic offsets (and objects) it holds.
# MAGIC
# MAGIC For each table version the notebook checks that every message up to that version's offsets is either in the
# MAGIC table or in quarantine, then compares a time window of the topic with the table at a chosen version.
# MAGIC Timestamps are milliseconds since the epoch or ISO-8601 text in UTC; empty means the topic's first / last message.

# COMMAND ----------

dbutils.widgets.text("etcd_endpoints", "127.0.0.1:2379", "etcd endpoints")
dbutils.widgets.text("root_prefix", "/danube-data", "storage root prefix in etcd")
dbutils.widgets.text("storage_url", "./danube-data/cloud-storage", "storage URL")
dbutils.widgets.text("storage_options", "{}", "storage options (JSON)")
dbutils.widgets.text("wal_root", "auto", "WAL root (auto | none | URL)")
dbutils.widgets.text("topic", "/default/orders", "topic")
dbutils.widgets.text("target_path", "/tmp/danube/delta/orders_notebook", "Delta target path")
dbutils.widgets.text("quarantine_path", "/tmp/danube/delta/orders_notebook_quarantine", "Delta quarantine path")
dbutils.widgets.text("starting_timestamp", "", "window start (publish time)")
dbutils.widgets.text("ending_timestamp", "", "window end, exclusive (publish time)")
dbutils.widgets.text("version", "", "table version to compare (empty: latest)")
dbutils.widgets.text("max_versions", "20", "newest versions to reconcile")

# COMMAND ----------

import json

import connectors
from notebook_widgets import millis
from notebook_widgets import source_options as source_options_from
from delta.tables import DeltaTable
from pyspark.sql import functions as F

connectors.register(spark)


def widget(name):
    return dbutils.widgets.get(name).strip()


source_options = {**source_options_from(widget), "topic": widget("topic")}
target_path = widget("target_path")
quarantine_path = widget("quarantine_path")


def topic_rows(starting=None, ending=None):
    """A batch read of the topic; `starting`/`ending` are extra `danube` options."""
    return spark.read.format("danube").options(**source_options).options(**(starting or {})).options(**(ending or {})).load()


def partition_topic():
    """`_topic` as the pipeline stores it: a partition's own name (`/ns/t-part-N`)."""
    return F.when(F.col("partition").isNull(), F.col("topic")).otherwise(
        F.concat(F.col("topic"), F.lit("-part-"), F.col("partition").cast("string"))
    )

# COMMAND ----------

# MAGIC %md
# MAGIC ## The table's history
# MAGIC Each pipeline commit names its micro-batch and, per topic partition, the offsets `[start, end)` it covered.
# MAGIC `covered_to` accumulates them: the end offset reached by that version.

# COMMAND ----------

history = (
    DeltaTable.forPath(spark, target_path).history()
    .select("version", "timestamp", "operation", F.col("operationMetrics")["numOutputRows"].alias("rows_written"), "userMetadata")
    .orderBy("version")
    .collect()
)
covered_to, first_start, history_rows = {}, {}, []
for entry in history:
    meta = json.loads(entry["userMetadata"]) if entry["userMetadata"] else {}
    for t, span in meta.get("offsets", {}).items():
        covered_to[t] = max(covered_to.get(t, 0), span["end"])
        first_start[t] = min(first_start.get(t, span["start"]), span["start"])
    history_rows.append((entry["version"], entry["timestamp"], entry["operation"], int(entry["rows_written"] or 0),
                         meta.get("batch_id"), json.dumps(dict(sorted(covered_to.items())))))
history_df = spark.createDataFrame(
    history_rows, "version long, timestamp timestamp, operation string, rows_written long, batch_id long, covered_to string"
)
display(history_df)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Every version reconciled with the topic
# MAGIC For a version `v`: `topic_messages` = the topic's messages from the pipeline's first offsets up to `covered_to`
# MAGIC (read from Danube storage now), `table_rows` = rows of the table `versionAsOf v`, `quarantined` = quarantine rows
# MAGIC of batches up to that version's batch. `unaccounted` must be 0: nothing was lost or written twice.

# COMMAND ----------

quarantine_df = spark.read.format("delta").load(quarantine_path)
reconcile_rows = []
for version, _, _, _, batch_id, covered in history_rows[-int(widget("max_versions")):]:
    ends = json.loads(covered)
    if not ends:
        continue
    topic_messages = topic_rows(
        {"startingOffsets": json.dumps({t: first_start[t] for t in ends})}, {"endingOffsets": json.dumps(ends)}
    ).count()
    table_rows = spark.read.format("delta").option("versionAsOf", version).load(target_path).count()
    quarantined = quarantine_df.filter(F.col("_batch_id") <= batch_id).count()
    reconcile_rows.append((version, batch_id, topic_messages, table_rows, quarantined, topic_messages - table_rows - quarantined))
reconcile_df = spark.createDataFrame(
    reconcile_rows, "version long, batch_id long, topic_messages long, table_rows long, quarantined long, unaccounted long"
)
display(reconcile_df)

# COMMAND ----------

# MAGIC %md
# MAGIC ## A time window: the topic versus the table
# MAGIC The topic read with `startingTimestamp`/`endingTimestamp`, and the same publish-time window of the table at the
# MAGIC chosen version and of the quarantine. `missing` lists messages of the window that are in neither table.

# COMMAND ----------

starting = {"startingTimestamp": str(millis(widget("starting_timestamp")))} if widget("starting_timestamp") else {}
ending = {"endingTimestamp": str(millis(widget("ending_timestamp")))} if widget("ending_timestamp") else {}
window_df = topic_rows(starting, ending).select(
    partition_topic().alias("_topic"), F.col("offset").alias("_offset"), F.col("publish_time").alias("_publish_time")
).cache()
bounds = window_df.agg(F.min("_publish_time").alias("lo"), F.max("_publish_time").alias("hi")).first()
version = int(widget("version")) if widget("version") else history_rows[-1][0]
table_at_version = spark.read.format("delta").option("versionAsOf", version).load(target_path)


def in_window(df):
    if bounds["lo"] is None:
        return df.limit(0)
    return df.filter((F.col("_publish_time") >= F.lit(bounds["lo"])) & (F.col("_publish_time") <= F.lit(bounds["hi"])))


def describe(name, df):
    row = df.agg(F.count(F.lit(1)).alias("n"), F.min("_offset").alias("lo"), F.max("_offset").alias("hi"),
                 F.min("_publish_time").alias("t0"), F.max("_publish_time").alias("t1")).first()
    return (name, row["n"], row["lo"], row["hi"], row["t0"], row["t1"])


table_window = in_window(table_at_version.select("_topic", "_offset", "_publish_time"))
quarantine_window = in_window(quarantine_df.select("_topic", "_offset", "_publish_time"))
window_compare_df = spark.createDataFrame(
    [describe("topic", window_df), describe(f"table@v{version}", table_window), describe("quarantine", quarantine_window)],
    "source string, rows long, first_offset long, last_offset long, first_publish_time timestamp, last_publish_time timestamp",
)
display(window_compare_df)

missing_df = window_df.join(table_window.unionByName(quarantine_window), ["_topic", "_offset"], "left_anti")
display(missing_df.orderBy("_topic", "_offset").limit(20))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Over time
# MAGIC Left: the topic's messages per minute of publish time in the window. Right: rows in the table after each
# MAGIC commit, by commit time.

# COMMAND ----------

import matplotlib.pyplot as plt

per_minute = (
    window_df.groupBy(F.date_trunc("minute", "_publish_time").alias("minute")).count().orderBy("minute").collect()
)
fig, (topic_ax, table_ax) = plt.subplots(1, 2, figsize=(14, 4))
minute_in_days = 1 / (24 * 60)  # matplotlib dates are in days
topic_ax.bar([r["minute"] for r in per_minute], [r["count"] for r in per_minute], width=0.8 * minute_in_days,
             align="edge", color="tab:blue")
topic_ax.set_title("Topic: messages per minute (publish time)")
topic_ax.tick_params(axis="x", labelrotation=30)
cumulative, total = [], 0
for row in history_rows:
    total += row[3]
    cumulative.append(total)
table_ax.step([row[1] for row in history_rows], cumulative, where="post", marker="o", color="tab:green")
table_ax.set_title("Table: rows after each commit")
table_ax.tick_params(axis="x", labelrotation=30)
fig.tight_layout()
display(fig)
window_df.unpersist()
