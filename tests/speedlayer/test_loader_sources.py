"""What a worker loads, checked value by value against the source: a table written by Spark with
the pipelines' Delta write options, and a Delta table on S3 (moto) read through fsspec."""

from __future__ import annotations

import datetime as dt
import decimal

import pytest

from speedlayer.api.v1 import control_plane_service_pb2 as cp
from speedlayer.api.v1 import management_service_pb2 as mg
from speedlayer.sources.delta import DeltaTableSource
from speedlayer.worker.loader import EpochLoader


def load(resolved, name: str, storage_options: dict | None = None) -> EpochLoader:
    plan = cp.LoadPlan(plan_id=name, source=resolved.source, destination_table_name=name,
                       arrow_schema=resolved.arrow_schema, partition_columns=resolved.partition_columns)
    loader = EpochLoader(memory_limit_bytes=256 * 1024 * 1024, threads=1, storage_options=storage_options)
    result = loader.load(plan)
    assert result.rows == resolved.total_rows
    return loader


def source(uri: str) -> mg.DataSourceIdentifier:
    return mg.DataSourceIdentifier(delta_table=mg.DeltaTable(table_uri=uri))


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_spark_written_delta_table_loads_with_typed_partitions(spark, tmp_path):
    from pyspark.sql import functions as F

    path = str(tmp_path / "orders")
    frame = (spark.range(0, 5000).withColumn("day", F.expr("date_add(DATE'2024-01-01', CAST(id % 4 AS INT))"))
             .withColumn("created_at", F.expr("TIMESTAMP'2024-01-01 00:00:00' + make_interval(0,0,0,0,0,0,id)"))
             .withColumn("price", F.expr("CAST(id / 100 AS DECIMAL(12,2))"))
             .withColumn("region", F.expr("CASE WHEN id % 7 = 0 THEN NULL ELSE concat('r', id % 3) END")))
    for batch_id, part in enumerate((frame.filter("id < 2500"), frame.filter("id >= 2500"))):
        # the options pipelines.delta_sink writes every micro-batch with
        (part.write.format("delta").mode("append").option("txnAppId", "orders").option("txnVersion", str(batch_id))
         .option("mergeSchema", "false").partitionBy("day", "region").save(path))
    resolved = DeltaTableSource().resolve(source(path), [])
    assert resolved.partition_columns == ["day", "region"] and resolved.version == 1
    con = load(resolved, "spark_orders").cursor()
    ours = con.execute("SELECT count(*), sum(id), sum(price), count(region), min(day), max(created_at) FROM spark_orders").fetchone()
    theirs = spark.read.format("delta").load(path).agg(
        F.count("*"), F.sum("id"), F.sum("price"), F.count("region"), F.min("day"), F.max("created_at")).first()
    assert ours[:5] == (theirs[0], theirs[1], decimal.Decimal(theirs[2]), theirs[3], theirs[4])
    assert isinstance(ours[4], dt.date)
    assert ours[5].replace(tzinfo=None) == theirs[5].replace(tzinfo=None) or ours[5] == theirs[5]


@pytest.mark.integration
def test_delta_table_on_s3_loads_through_fsspec(moto_process, unique_name):
    moto_s3 = moto_process
    uri = moto_s3.write_orders_table(unique_name("bkt")[:63].rstrip("-"), 900)
    resolved = DeltaTableSource(moto_s3.delta_options).resolve(source(uri), [{"day": "d1"}])
    assert resolved.file_count == 1 and all(f.uri.startswith("s3://") for f in resolved.source.delta.files)
    con = load(resolved, "s3_orders", {"s3": moto_s3.storage_options}).cursor()
    assert con.execute("SELECT count(*), sum(id), min(day), max(day) FROM s3_orders").fetchone() == (
        300, sum(range(1, 900, 3)), "d1", "d1")
