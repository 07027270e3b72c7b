"""`orders_bronze`: a streaming table stored as Delta, fed by the `danube` source.

The source options come from the pipeline spec's `configuration` (`danube.*` keys), so the
same file runs locally with `spark-pipelines` and in a Databricks Lakeflow pipeline whose
configuration sets those keys.
"""

from pyspark import pipelines as dp
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

spark = SparkSession.active()


# The ignore: pyspark 4.2's `table` takes `format`, but its typing overloads leave it out.
@dp.table(name="orders_bronze", format="delta", comment="Danube /default/orders as it was published")  # type: ignore[call-overload]
def orders_bronze():
    return (
        spark.readStream.format("danube")
        .option("etcd.endpoints", spark.conf.get("danube.etcd.endpoints"))
        .option("storage.url", spark.conf.get("danube.storage.url"))
        .option("topic", spark.conf.get("danube.topic"))
        .option("subscription", spark.conf.get("danube.subscription"))
        .option("startingOffsets", "earliest")
        .load()
        .select(
            "topic", "partition", "offset", "publish_time", "producer_name",
            F.col("payload").cast("string").alias("payload"), "schema_id", "schema_version",
        )
    )
