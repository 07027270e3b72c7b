"""Batch reads through `spark.read.format("danube")` of topics built in the broker's layout.

Topics live in the session's real etcd, objects in a fresh moto S3 bucket, WAL files in
`tmp_path`. The `danube_env` fixture and the helpers here are shared with the streaming tests.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest

from danube_core.metadata import MetadataStore
from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.objectstore import ObjectStore
from tests.topic_builder import BIG_PRODUCER_ID, TopicBuilder

pytestmark = pytest.mark.spark


@dataclass
class DanubeEnv:
    """One test's Danube deployment: etcd, a bucket, a WAL root and the source options."""

    metadata: MetadataStore
    store: ObjectStore
    wal_root: Path
    options: dict[str, str]

    def topic(self, name: str) -> TopicBuilder:
        """A new topic on its own broker (random id, so tests never share a registration)."""
        return TopicBuilder(self.metadata, self.store, str(self.wal_root), name, broker_id=random.getrandbits(63))


@pytest.fixture
def danube_env(etcd_endpoint: str, moto_s3, s3_bucket: str, tmp_path: Path):
    metadata = EtcdMetadataStore(etcd_endpoint)
    store = ObjectStore(f"s3://{s3_bucket}", moto_s3.storage_options)
    options = {
        "etcd.endpoints": etcd_endpoint,
        "storage.url": f"s3://{s3_bucket}",
        "storage.key": "testing",
        "storage.secret": "testing",
        "storage.client_kwargs.endpoint_url": moto_s3.endpoint_url,
        "storage.client_kwargs.region_name": "us-east-1",
    }
    yield DanubeEnv(metadata, store, tmp_path / "wal", options)
    metadata.close()


def read(spark, env: DanubeEnv, **options: str):
    return spark.read.format("danube").options(**env.options).options(**options).load()


def expected_row(builder: TopicBuilder, offset: int) -> dict:
    msg = builder.messages[offset]
    return {
        "offset": offset,
        "payload": msg.payload,
        "producer_id": Decimal(msg.msg_id.producer_id),
        "attributes": msg.attributes,
        "schema_id": None if msg.schema_id is None else Decimal(msg.schema_id),
        "schema_version": msg.schema_version,
        "publish_ms": msg.publish_time,
        "producer_name": msg.producer_name,
    }


def actual_row(row) -> dict:
    return {
        "offset": row["offset"],
        "payload": bytes(row["payload"]),
        "producer_id": row["producer_id"],
        "attributes": dict(row["attributes"]),
        "schema_id": row["schema_id"],
        "schema_version": row["schema_version"],
        "publish_ms": row["publish_ms"],
        "producer_name": row["producer_name"],
    }


def collect(df) -> list:
    from pyspark.sql import functions as F

    ms = (F.unix_micros(F.col("publish_time")) / 1000).cast("long").alias("publish_ms")
    return df.select("*", ms).orderBy("topic", "partition", "offset").collect()


def test_batch_read_equals_what_was_produced(spark, danube_env: DanubeEnv, unique_name) -> None:
    name = f"/default/{unique_name('orders')}"
    b = danube_env.topic(name)
    b.append(1500)
    b.rotate()
    b.append(500)
    obj = b.upload()  # one object spanning wal.log and wal.1.log, offsets 0..1999
    b.append(500)  # 2000..2499 only in the WAL

    df = read(spark, danube_env, topic=name, includeSource="true", maxPartitionBytes="64k")
    assert df.rdd.getNumPartitions() > 2  # the object is split at its index entries
    rows = collect(df)

    assert [r["offset"] for r in rows] == list(range(2500))
    assert {r["topic"] for r in rows} == {name} and {r["partition"] for r in rows} == {None}
    assert [actual_row(r) for r in rows] == [expected_row(b, o) for o in range(2500)]
    assert rows[0]["producer_id"] == Decimal(BIG_PRODUCER_ID)
    assert {r["source"] for r in rows[:2000]} == {obj.object_id}
    assert {r["source"] for r in rows[2000:]} == {"wal"}


def test_partitioned_topic_with_offsets_json(spark, danube_env: DanubeEnv, unique_name) -> None:
    base = f"/default/{unique_name('parts')}"
    builders = [danube_env.topic(f"{base}-part-{k}") for k in range(3)]
    for k, b in enumerate(builders):
        b.append(20 + k)
        if k == 0:
            b.upload()

    df = read(spark, danube_env, topic=base,
              startingOffsets=f'{{"{base}": 2, "{base}-part-1": 5}}',
              endingOffsets=f'{{"{base}": -1, "{base}-part-2": 10}}')
    got = {(r["partition"], r["offset"]) for r in collect(df)}
    want = {(0, o) for o in range(2, 20)} | {(1, o) for o in range(5, 21)} | {(2, o) for o in range(2, 10)}
    assert got == want
    assert {r["topic"] for r in collect(df)} == {base}


def test_etcd_unreachable_at_start_is_a_clear_error(spark, danube_env: DanubeEnv, unique_name) -> None:
    from danube_core.ports import free_port

    endpoint = f"127.0.0.1:{free_port()}"
    options = {**danube_env.options, "etcd.endpoints": endpoint, "etcd.timeoutMs": "500"}
    df = spark.read.format("danube").options(**options).option("topic", "/default/x").load()
    with pytest.raises(Exception) as info:
        df.collect()
    assert "MetadataUnavailableError" in str(info.value)
    assert endpoint in str(info.value)
