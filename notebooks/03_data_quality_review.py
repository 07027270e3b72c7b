# Databricks notebook source
# MAGIC %md
# MAGIC # Data quality review
# MAGIC
# MAGIC What the great-expectations suite said about each micro-batch of a pipeline, which expectations the
# MAGIC quarantined records failed, and what those records look like.
# MAGIC
# MAGIC The pipeline writes three Delta tables: the target (valid rows), the quarantine (rows that could not be decoded
# MAGIC or failed an expectation, with the raw payload, `_decode_error` and `_failed_expectations`), and, when the
# MAGIC pipeline's `expectations.results` is set, one row per expectation per batch. Name a pipeline file to take the
# MAGIC three locations from it, or give them directly (paths, or metastore table names).

# COMMAND ----------

dbutils.widgets.text("pipeline_file", "", "pipeline YAML (empty: use the locations below)")
dbutils.widgets.text("results_table", "/tmp/danube/delta/orders_notebook_quality", "expectation results (path or table)")
dbutils.widgets.text("quarantine_table", "/tmp/danube/delta/orders_notebook_quarantine", "quarantine (path or table)")
dbutils.widgets.text("target_table", "/tmp/danube/delta/orders_notebook", "target (path or table)")
dbutils.widgets.text("sample_rows", "10", "bad records to show")

# COMMAND ----------

from pyspark.sql import functions as F

from pipelines.config import load_config


def widget(name):
    return dbutils.widgets.get(name).strip()


def read_table(location):
    """A Delta table by path (contains '/' or a URL scheme) or by metastore name."""
    if "/" in location or ":" in location:
        return spark.read.format("delta").load(location)
    return spark.table(location)


def table_location(table):
    return None if table is None else (table.path if table.path is not None else table.table)


if widget("pipeline_file"):
    config = load_config(widget("pipeline_file"))
    results_location = table_location(config.expectations.results if config.expectations else None)
    quarantine_location = table_location(config.quarantine)
    target_location = table_location(config.target)
else:
    results_location = widget("results_table") or None
    quarantine_location = widget("quarantine_table")
    target_location = widget("target_table")
sample_rows = int(widget("sample_rows"))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Expectation results per batch
# MAGIC One row per micro-batch: how many expectations ran and failed, and how many rows they flagged. Below it, each
# MAGIC expectation of each batch with great-expectations' own counts and observed value.

# COMMAND ----------

results_df = read_table(results_location).cache() if results_location else None
if results_df is None:
    print("The pipeline keeps no expectation results table (set expectations.results in its file).")
else:
    per_batch_df = (
        results_df.groupBy("pipeline", "batch_id", "suite")
        .agg(
            F.count(F.lit(1)).alias("expectations"),
            F.sum(F.when(~F.col("success"), 1).otherwise(0)).alias("failed_expectations"),
            F.sum(F.coalesce(F.col("unexpected_count"), F.lit(0))).alias("unexpected_rows"),
            F.max("element_count").alias("rows_validated"),
            F.max("suite_duration_s").alias("suite_duration_s"),
            F.max("validated_at").alias("validated_at"),
        )
        .orderBy("batch_id")
    )
    display(per_batch_df)
    display(
        results_df.select("batch_id", "expectation", "success", "element_count", "unexpected_count", "observed_value")
        .orderBy("batch_id", "expectation")
    )

# COMMAND ----------

import matplotlib.pyplot as plt

if results_df is not None:
    counts = results_df.select("batch_id", "expectation", "unexpected_count").orderBy("batch_id").collect()
    batches = sorted({r["batch_id"] for r in counts})
    fig, ax = plt.subplots(figsize=(12, 4))
    bottom = [0] * len(batches)
    for expectation in sorted({r["expectation"] for r in counts}):
        by_batch = {r["batch_id"]: r["unexpected_count"] or 0 for r in counts if r["expectation"] == expectation}
        heights = [by_batch.get(b, 0) for b in batches]
        ax.bar([str(b) for b in batches], heights, bottom=bottom, label=expectation)
        bottom = [a + b for a, b in zip(bottom, heights)]
    ax.set_xlabel("micro-batch")
    ax.set_ylabel("unexpected rows")
    ax.set_title("Rows flagged per batch, by expectation")
    ax.legend(fontsize="small")
    fig.tight_layout()
    display(fig)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Quarantine by failed expectation
# MAGIC A record that failed several expectations counts once under each. Records that could not be decoded are
# MAGIC listed under `decode: <reason>` (the suite never saw them).

# COMMAND ----------

quarantine_df = read_table(quarantine_location).cache()
reasons_df = quarantine_df.select(
    "*",
    F.explode(
        F.when(F.col("_decode_error").isNotNull(), F.array(F.concat(F.lit("decode: "), F.col("_decode_error"))))
        .otherwise(F.col("_failed_expectations"))
    ).alias("reason"),
)
by_reason_df = (
    reasons_df.groupBy("reason")
    .agg(
        F.count(F.lit(1)).alias("records"),
        F.countDistinct("_batch_id").alias("batches"),
        F.sort_array(F.collect_set("_topic")).alias("topics"),
        F.min("_publish_time").alias("first_publish_time"),
        F.max("_publish_time").alias("last_publish_time"),
    )
    .orderBy(F.desc("records"), "reason")
)
display(by_reason_df)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Sample bad records
# MAGIC The raw payload as text, where it came from (topic partition, offset, object or WAL) and why it was rejected.

# COMMAND ----------

sample_df = (
    quarantine_df.select(
        "_topic", "_offset", "_publish_time", "_source", "_batch_id",
        F.col("payload").cast("string").alias("payload_text"), "_decode_error", "_failed_expectations",
    )
    .orderBy("_topic", "_offset")
    .limit(sample_rows)
)
display(sample_df)

# COMMAND ----------

target_rows = read_table(target_location).count()
quarantined_rows = quarantine_df.count()
share = quarantined_rows / (target_rows + quarantined_rows) if target_rows + quarantined_rows else 0.0
quality_summary_df = spark.createDataFrame(
    [(target_rows, quarantined_rows, round(100.0 * share, 2))],
    "valid_rows long, quarantined_rows long, quarantined_percent double",
)
display(quality_summary_df)
quarantine_df.unpersist()
if results_df is not None:
    results_df.unpersist()
