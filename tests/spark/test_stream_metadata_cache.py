"""A real streaming query plans from its LocalCache: etcd serves it no range read after its
first trigger, counted by the etcd server itself (its gRPC metrics), on an etcd of this test's
own so that nothing else reads from it. (The session's cursor-committing listener, which reads
each cursor before writing it from Spark's driver, is set aside for the query: it is not the
source's driver.)"""

from __future__ import annotations

import re
import urllib.request
from typing import Iterator

import pytest

from connectors import register
from danube_core.embedded_etcd import EmbeddedEtcd
from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.objectstore import ObjectStore
from tests.rig import eventually
from tests.topic_builder import TopicBuilder

pytestmark = [pytest.mark.spark, pytest.mark.slow]

MESSAGES_PER_TRIGGER = 10
_RANGE_STARTED = re.compile(
    r'^grpc_server_started_total\{grpc_method="Range",grpc_service="etcdserverpb.KV",[^}]*\} (\d+)$', re.M)


def range_reads(etcd: EmbeddedEtcd) -> int:
    """Range RPCs the etcd server has started since it started."""
    text = urllib.request.urlopen(f"http://{etcd.endpoint}/metrics", timeout=10).read().decode()
    return int(_RANGE_STARTED.search(text).group(1))


@pytest.fixture
def own_etcd() -> Iterator[EmbeddedEtcd]:
    with EmbeddedEtcd() as etcd:
        yield etcd


def test_streaming_query_makes_no_etcd_range_reads_after_its_first_trigger(
        spark, own_etcd, moto_s3, s3_bucket, tmp_path, unique_name):
    metadata = EtcdMetadataStore(own_etcd.endpoint)
    store = ObjectStore(f"s3://{s3_bucket}", moto_s3.storage_options)
    topic = f"/default/{unique_name('cached')}"
    builder = TopicBuilder(metadata, store, str(tmp_path / "wal"), topic)
    builder.append(60)
    builder.upload()
    builder.append(60)  # 120 messages: 12 triggers of 10, from objects then from the WAL
    df = (spark.readStream.format("danube")
          .option("etcd.endpoints", own_etcd.endpoint).option("storage.url", f"s3://{s3_bucket}")
          .option("storage.key", "testing").option("storage.secret", "testing")
          .option("storage.client_kwargs.endpoint_url", moto_s3.endpoint_url)
          .option("storage.client_kwargs.region_name", "us-east-1")
          .option("walRoot", str(tmp_path / "wal")).option("topic", topic)
          .option("subscription", unique_name("sub")).option("startingOffsets", "earliest")
          .option("maxMessagesPerTrigger", str(MESSAGES_PER_TRIGGER)).load())
    name = unique_name("q").replace("-", "_")
    committer = register(spark)
    spark.streams.removeListener(committer)
    query = df.writeStream.format("memory").queryName(name).start()
    try:
        eventually(lambda: any(p.numInputRows > 0 for p in query.recentProgress), deadline_s=120)
        after_first = range_reads(own_etcd)
        builder.upload()  # new descriptors while the stream runs: the cache's watch brings them
        builder.append(40)
        builder.upload()
        query.processAllAvailable()
        assert query.exception() is None
        assert range_reads(own_etcd) == after_first
        offsets = [r[0] for r in spark.sql(f"select offset from {name}").collect()]
        assert sorted(offsets) == list(range(160))
    finally:
        query.stop()
        spark.streams.addListener(committer)
        builder.close()
        metadata.close()
