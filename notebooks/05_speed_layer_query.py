# Databricks notebook source
# MAGIC %md
# MAGIC # The speed layer next to Spark: the same SQL on the same Delta table
# MAGIC
# MAGIC The speed layer keeps a Delta table (an **epoch**: one table version) in the memory of its workers; the
# MAGIC **Data Gateway** routes each query to a worker holding the newest READY epoch and streams the answer back as
# MAGIC Arrow. This notebook runs one query through the gateway and the same query in Spark on the table's files
# MAGIC (uncached, then cached), checks that the answers agree, and compares the latencies.
# MAGIC
# MAGIC With `masters` set, the notebook first admits the table to the speed layer and waits until it is READY;
# MAGIC otherwise the dataset must already be admitted (`python -m speedlayer admin ... admit`). In the SQL the
# MAGIC dataset is a table name (`FROM orders`). The `token` widget is the tenant's gateway token, if it has one.
# MAGIC
# MAGIC The last cells run the same SQL through the gateway's **Arrow Flight SQL** with the ADBC driver, the way
# MAGIC pandas, polars, BI tools and JDBC clients connect (user = tenant, password = token), next to
# MAGIC `speedlayer.clients`.

# COMMAND ----------

dbutils.widgets.text("gateway", "127.0.0.1:7800", "Data Gateway host:port")
dbutils.widgets.text("masters", "", "masters host:port,... (set: admit the table first)")
dbutils.widgets.text("tenant", "demo", "tenant")
dbutils.widgets.text("token", "", "tenant token (if the gateway requires one)")
dbutils.widgets.text("dataset", "orders", "speed layer dataset")
dbutils.widgets.text("table_path", "/tmp/danube/delta/orders_notebook", "Delta table (the pipeline's target)")
dbutils.widgets.text("sql", "SELECT currency, count(*) AS orders, round(sum(amount), 2) AS amount "
                     "FROM orders GROUP BY currency ORDER BY currency", "SQL (the dataset is a table)")
dbutils.widgets.text("runs", "10", "timed runs per engine")

# COMMAND ----------

import statistics
import time

import pandas as pd

from speedlayer.clients import ManagementClient, QueryClient, delta_request
from speedlayer.errors import ReplicaUnavailableError


def widget(name):
    return dbutils.widgets.get(name).strip()


dataset, sql, runs = widget("dataset"), widget("sql"), max(1, int(widget("runs")))
table_path = widget("table_path")


def timed(run):
    """(last result, latencies in ms) of `runs` calls."""
    latencies, result = [], None
    for _ in range(runs):
        started = time.perf_counter()
        result = run()
        latencies.append((time.perf_counter() - started) * 1000)
    return result, latencies

# COMMAND ----------

# MAGIC %md ## Admit the table (when `masters` is set) and wait until the gateway answers

# COMMAND ----------

if widget("masters"):
    admin = ManagementClient(widget("masters"))
    reply = admin.admit(delta_request(widget("tenant"), dataset, table_path))
    deadline = time.monotonic() + 120
    while True:
        status = admin.status(widget("tenant"), dataset, reply.epoch_id)
        ready = [r.worker_id for e in status.epochs for r in e.replicas if r.state == "READY"]
        if ready or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    admin.close()
    display(pd.DataFrame([{"epoch": reply.epoch_id, "status": reply.status, "ready_on": ", ".join(ready)}]))

client = QueryClient(widget("gateway"), widget("tenant"), token=widget("token") or None, client_id="notebook")
deadline = time.monotonic() + 60
while True:
    try:
        client.query(dataset, f"SELECT 1 AS one FROM {dataset} LIMIT 1")
        break
    except ReplicaUnavailableError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.2)

# COMMAND ----------

# MAGIC %md ## Through the gateway

# COMMAND ----------

gateway_result, gateway_ms = timed(lambda: client.query(dataset, sql))
gateway_frame = gateway_result.to_pandas()
display(gateway_frame)

# COMMAND ----------

# MAGIC %md ## The same SQL in Spark: uncached (the table's files read each time), then cached

# COMMAND ----------


def spark_uncached():
    spark.read.format("delta").load(table_path).createOrReplaceTempView(dataset)
    return spark.sql(sql).toPandas()


spark_frame, uncached_ms = timed(spark_uncached)
cached = spark.read.format("delta").load(table_path).cache()
cached.count()
cached.createOrReplaceTempView(dataset)
_, cached_ms = timed(lambda: spark.sql(sql).toPandas())
cached.unpersist()
display(spark_frame)

# COMMAND ----------

# MAGIC %md ## Same answer? And how long each took

# COMMAND ----------


def normalised(frame):
    frame = frame.reset_index(drop=True)
    return frame.sort_values(list(frame.columns)).reset_index(drop=True).astype(str)


same_answer = normalised(gateway_frame).equals(normalised(spark_frame))
latency = pd.DataFrame([
    {"engine": name, "p50_ms": round(statistics.median(ms), 2), "min_ms": round(min(ms), 2),
     "max_ms": round(max(ms), 2), "runs": len(ms)}
    for name, ms in (("speed layer (gateway)", gateway_ms), ("Spark uncached", uncached_ms),
                     ("Spark cached", cached_ms))])
latency["vs_gateway"] = (latency["p50_ms"] / latency["p50_ms"].iloc[0]).round(1)
display(pd.DataFrame([{"same_answer": same_answer, "rows": len(gateway_frame)}]))
display(latency)

# COMMAND ----------

import matplotlib.pyplot as plt

figure, axis = plt.subplots(figsize=(7, 3))
axis.barh(latency["engine"], latency["p50_ms"])
axis.set_xscale("log")
axis.set_xlabel("p50 latency, ms (log scale)")
axis.set_title(f"{dataset}: {runs} runs each")
figure.tight_layout()
display(figure)
client.close()

# COMMAND ----------

# MAGIC %md ## The same SQL through Flight SQL (ADBC), as pandas, polars and BI tools connect
# MAGIC
# MAGIC `adbc_driver_flightsql` logs in with the tenant as the user and its token as the password; the gateway
# MAGIC answers from the same READY epoch as `speedlayer.clients` above.

# COMMAND ----------

import adbc_driver_flightsql.dbapi as flight_sql

gateway_url = widget("gateway") if "://" in widget("gateway") else f"grpc://{widget('gateway')}"
with flight_sql.connect(gateway_url, db_kwargs={"username": widget("tenant"), "password": widget("token")},
                        autocommit=True) as connection, connection.cursor() as cursor:
    def adbc_query():
        cursor.execute(sql)
        return cursor.fetch_arrow_table()

    adbc_result, adbc_ms = timed(adbc_query)
    tables = connection.adbc_get_objects(depth="tables").read_all().to_pylist()
adbc_frame = adbc_result.to_pandas()
display(adbc_frame)
display(pd.DataFrame([{
    "same_answer_as_speedlayer_clients": normalised(adbc_frame).equals(normalised(gateway_frame)),
    "adbc_p50_ms": round(statistics.median(adbc_ms), 2), "speedlayer_clients_p50_ms": round(statistics.median(gateway_ms), 2),
    "tables": ", ".join(t["table_name"] for c in tables for s in c["catalog_db_schemas"] for t in s["db_schema_tables"]),
}]))
