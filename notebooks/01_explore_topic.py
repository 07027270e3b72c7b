# Databricks notebook source
# MAGIC %md
# MAGIC # Explore a Danube topic
# MAGIC
# MAGIC Reads Danube's storage directly (etcd metadata, `.dnb1` objects, the brokers' WAL files); no broker
# MAGIC needs to be running. This notebook shows:
# MAGIC
# MAGIC 1. the topics and partitions of a namespace, where their messages are stored, and whether they are sealed;
# MAGIC 2. the object descriptors and sealed state of one topic;
# MAGIC 3. a batch read of a chosen offset or time range with `spark.read.format("danube")`;
# MAGIC 4. how far behind each subscription is (messages, bytes, milliseconds), as a chart.
# MAGIC
# MAGIC Needs the `danube-spark` package installed on the cluster. Set the widgets above and run all.
# MAGIC Offsets: `ending_offset` is end-exclusive (as Spark's Kafka source); cursors are the last acknowledged offset.
# MAGIC Timestamps are milliseconds since the epoch or ISO-8601 text in UTC (`2024-05-01T12:00:00`).

# COMMAND ----------

dbutils.widgets.text("etcd_endpoints", "127.0.0.1:2379", "etcd endpoints")
dbutils.widgets.text("root_prefix", "/danube-data", "storage root prefix in etcd")
dbutils.widgets.text("storage_url", "./danube-data/cloud-storage", "storage URL")
dbutils.widgets.text("storage_options", "{}", "storage options (JSON)")
dbutils.widgets.text("wal_root", "auto", "WAL root (auto | none | URL)")
dbutils.widgets.text("namespace", "default", "namespace to list")
dbutils.widgets.text("topic", "/default/orders", "topic to read")
dbutils.widgets.text("starting_offset", "", "first offset (empty: earliest)")
dbutils.widgets.text("ending_offset", "", "end offset, exclusive (empty: latest)")
dbutils.widgets.text("starting_timestamp", "", "or: from publish time")
dbutils.widgets.text("ending_timestamp", "", "or: until publish time (exclusive)")
dbutils.widgets.text("subscription", "", "subscription (empty: all)")
dbutils.widgets.text("max_rows", "20", "rows to show")

# COMMAND ----------

import json

import connectors
from notebook_widgets import millis
from notebook_widgets import source_options as source_options_from
from connectors.topic_inspector import DescriptorRow, SealedRow, SubscriptionLag, TopicInspector, TopicOverview, rows
from pyspark.sql import functions as F

connectors.register(spark)


def widget(name):
    return dbutils.widgets.get(name).strip()


source_options = source_options_from(widget)
topic = widget("topic")
namespace = widget("namespace")
max_rows = int(widget("max_rows"))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Topics and partitions
# MAGIC One row per topic partition: its delivery mode, owning broker, readable offsets (`latest_offset` is the
# MAGIC next offset to be written), what is in sealed objects versus only in the WAL, and the sealed state
# MAGIC (a topic is sealed between an unload and its load on the next broker).

# COMMAND ----------

namespace_inspector = TopicInspector.from_options({**source_options, "namespace": namespace})
topics_df = spark.createDataFrame(rows(namespace_inspector.overview()), TopicOverview.ddl())
display(topics_df.orderBy("base_name", "partition"))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Storage of the chosen topic
# MAGIC The object descriptors in etcd (`<root>/storage/topics/{ns}/{topic}/objects/<start>`), oldest first, and the
# MAGIC sealed-state marker of each partition when there is one.

# COMMAND ----------

inspector = TopicInspector.from_options({**source_options, "topic": topic})
partitions = inspector.partitions(topic)
descriptors_df = spark.createDataFrame(
    rows(d for p in partitions for d in inspector.descriptors(p)), DescriptorRow.ddl()
)
display(descriptors_df.orderBy("topic", "start_offset"))

sealed_df = spark.createDataFrame(
    rows(s for p in partitions if (s := inspector.sealed_state(p)) is not None), SealedRow.ddl()
)
display(sealed_df)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Batch read of an offset or time range
# MAGIC `startingOffsets`/`endingOffsets` take one offset per topic partition (a partitioned topic's base name covers
# MAGIC all its partitions); `startingTimestamp`/`endingTimestamp` select by publish time. The `source` column says
# MAGIC whether each message came from an object or from the WAL.

# COMMAND ----------

reader = spark.read.format("danube").options(**source_options).option("topic", topic).option("includeSource", "true")
if widget("starting_timestamp"):
    reader = reader.option("startingTimestamp", str(millis(widget("starting_timestamp"))))
elif widget("starting_offset"):
    reader = reader.option("startingOffsets", json.dumps({topic: int(widget("starting_offset"))}))
if widget("ending_timestamp"):
    reader = reader.option("endingTimestamp", str(millis(widget("ending_timestamp"))))
elif widget("ending_offset"):
    reader = reader.option("endingOffsets", json.dumps({topic: int(widget("ending_offset"))}))

messages_df = reader.load().cache()
read_summary_df = (
    messages_df.groupBy("topic", "partition")
    .agg(
        F.count(F.lit(1)).alias("messages"),
        F.min("offset").alias("first_offset"),
        F.max("offset").alias("last_offset"),
        F.min("publish_time").alias("first_publish_time"),
        F.max("publish_time").alias("last_publish_time"),
        F.sort_array(F.collect_set("source")).alias("sources"),
    )
    .orderBy("topic", "partition")
)
display(read_summary_df)
display(
    messages_df.select(
        "topic", "partition", "offset", "publish_time", "producer_name",
        F.col("payload").cast("string").alias("payload_text"), "attributes", "schema_id", "schema_version", "source",
    )
    .orderBy("partition", "offset")
    .limit(max_rows)
)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Lag per subscription
# MAGIC For each subscription of each partition: its cursor (last acknowledged offset), and how far it is behind the
# MAGIC newest message in messages, in bytes a reader would fetch, and in publish-time milliseconds. A subscription
# MAGIC without a cursor starts at the latest offset when it attaches, so it shows no lag.

# COMMAND ----------

lag_records = inspector.lag(partitions, widget("subscription") or None)
lag_df = spark.createDataFrame(rows(lag_records), SubscriptionLag.ddl())
display(lag_df.orderBy("subscription", "topic"))

# COMMAND ----------

import matplotlib.pyplot as plt

labels = [f"{r.subscription} @ {r.topic.rsplit('/', 1)[-1]}" for r in lag_records]
fig, axes = plt.subplots(1, 3, figsize=(15, max(2.5, 0.5 * len(labels) + 1.5)), squeeze=False)
for ax, (field, title) in zip(axes[0], [("messages", "messages behind"), ("bytes", "bytes behind"), ("ms", "ms behind (publish time)")]):
    ax.barh(labels, [getattr(r, field) or 0 for r in lag_records], color="tab:orange")
    ax.set_title(title)
    ax.invert_yaxis()
fig.suptitle(f"Subscription lag of {topic}")
fig.tight_layout()
display(fig)

# COMMAND ----------

messages_df.unpersist()
inspector.close()
namespace_inspector.close()
