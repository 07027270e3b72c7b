"""A pipeline that names a speed-layer dataset announces its commits, and the master plans them.

Real Spark (the session-wide fixture) runs the pipeline into Delta; a real master process on an
etcd of its own follows the target table. The master's poll is set to an hour, so only the
pipeline's announcement can make it plan a new version at once. The first test reads the
worker's DuckDB in this process; the second goes the user's way, through a worker process and
the Data Gateway, querying while the pipeline keeps committing, then checks the same table
admitted sharded against Spark reading the same Delta version.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest

from pipelines.speedlayer_feed import SpeedLayerFeed
from speedlayer.clients import delta_request
from speedlayer.clients.query_client import QueryClient
from speedlayer.records import Announcement, AssignmentRecord, GlobalConfig, TenantConfig
from tests.rig import eventually
from devstack.speedlayer_cluster import SpeedLayerCluster
from tests.speedlayer.test_freshness import served_rows
from tests.spark.test_pipeline_decode import lake  # noqa: F401 (fixture)

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]


def test_pipeline_commits_are_announced_and_become_epochs(lake, tmp_path_factory):  # noqa: F811
    cluster = SpeedLayerCluster(tmp_path_factory.mktemp("speedlayer"))
    try:
        cluster.set_global(GlobalConfig(reassign_delay_s=1.0, replication_factor=1, refresh_poll_interval_s=3600,
                                        default_ttl_sec=3600))
        cluster.start_master("m1")
        agent = cluster.start_local_worker("acme", "w1")
        topic = lake.topic(f"/default/{lake.unique_name('fed')}")
        topic.append(5)
        config = lake.config([topic.name], decode={"format": "raw"}, rules=None)
        config = dataclasses.replace(config, speedlayer=SpeedLayerFeed(
            "acme", "events", etcd_endpoints=cluster.etcd_endpoint))
        first = lake.run(config)
        assert first.metrics.totals()["announced"] == 1 and first.metrics.totals()["announce_failures"] == 0

        client = cluster.client()
        eventually(lambda: len(client.workers("acme").workers) == 1, deadline_s=30)
        admitted = client.admit(delta_request("acme", "events", config.target.path))
        eventually(lambda: (s := served_rows(agent, "events", "_offset")) and s[2] == 5, deadline_s=60)

        topic.append(7)
        second = lake.run(config)
        assert second.metrics.totals()["announced"] == 1
        announced = Announcement.from_json(cluster.metadata.get(cluster.keys.announce("acme", "events")), "k")
        assert (announced.table_uri, announced.version, announced.writer) == (config.target.path, 1, config.name)
        served = eventually(lambda: (s := served_rows(agent, "events", "_offset")) and s[1] == 1 and s, deadline_s=60)
        assert served[2] == 12 and served[0] != admitted.epoch_id
        found = cluster.metadata.get_prefix(cluster.keys.dataset_assignments_prefix("acme", "events"))
        newest = max((AssignmentRecord.from_json(v, k) for k, v in found), key=lambda r: r.order)
        assert (newest.kind, newest.base_epoch, newest.total_rows) == ("incremental", admitted.epoch_id, 12)
        audit = (cluster.root / "speedlayer-audit-m1.jsonl").read_text().replace(" ", "")
        assert '"trigger":"announce"' in audit
    except BaseException:
        print(cluster.dump_logs())
        raise
    finally:
        cluster.stop()


def _committed_offsets(path: str) -> list[list[int]]:
    """The target's `_offset` values at each Delta version, sorted (deltalake, not Spark)."""
    from deltalake import DeltaTable

    latest = DeltaTable(path).version()
    return [sorted(DeltaTable(path, version=v).to_pyarrow_table(columns=["_offset"]).column("_offset").to_pylist())
            for v in range(latest + 1)]


def test_committed_rows_are_answered_through_the_gateway_once_while_the_pipeline_commits(
        lake, tmp_path_factory):  # noqa: F811
    """Broker storage -> pipeline -> Delta -> speed layer -> gateway: every answer is exactly one
    committed version's rows (none twice, never half an epoch), and the last commit is answered."""
    cluster = SpeedLayerCluster(tmp_path_factory.mktemp("speedlayer"))
    stop = threading.Event()
    try:
        cluster.set_global(GlobalConfig(reassign_delay_s=1.0, replication_factor=1, refresh_poll_interval_s=3600,
                                        default_ttl_sec=3600))
        cluster.start_master("m1")
        cluster.start_worker("acme", "w1")
        gateway = cluster.start_gateway()
        topic = lake.topic(f"/default/{lake.unique_name('served')}")
        topic.append(20)
        config = lake.config([topic.name], decode={"format": "raw"}, rules=None)
        config = dataclasses.replace(config, speedlayer=SpeedLayerFeed(
            "acme", "feed", etcd_endpoints=cluster.etcd_endpoint))
        lake.run(config)
        client = cluster.client()
        eventually(lambda: len(client.workers("acme").workers) == 1, deadline_s=30)
        client.admit(delta_request("acme", "feed", config.target.path))
        queries = QueryClient(gateway, "acme", client_id="e2e")

        def answer() -> list[int]:
            return sorted(queries.query("feed", "SELECT _offset FROM feed").column("_offset").to_pylist())

        def answered(expected: list[int]) -> bool:
            try:
                return answer() == expected
            except Exception:  # noqa: BLE001 (not READY yet: polled again)
                return False

        eventually(lambda: answered(list(range(20))), deadline_s=90)
        answers: list[list[int]] = []
        errors: list[BaseException] = []

        def keep_querying() -> None:
            while not stop.is_set():
                try:
                    answers.append(answer())
                except Exception as exc:  # noqa: BLE001 (collected, asserted below)
                    errors.append(exc)

        reader = threading.Thread(target=keep_querying, name="gateway-queries", daemon=True)
        reader.start()
        total = 20
        for more in (15, 25, 10):
            topic.append(more)
            lake.run(config)
            total += more
        eventually(lambda: answers and answers[-1] == list(range(total)), deadline_s=90)
        stop.set()
        reader.join(30)
        versions = _committed_offsets(config.target.path)
        assert versions[-1] == list(range(total))
        assert not errors, errors[:3]
        assert len(answers) > 10, len(answers)
        for offsets in answers:
            assert offsets in versions, f"an answer of {len(offsets)} rows matches no committed version"
        _sharded_answers_equal_sparks(lake, cluster, gateway, config.target.path, len(versions) - 1)
    except BaseException:
        print(cluster.dump_logs())
        raise
    finally:
        stop.set()
        cluster.stop()


def _sharded_answers_equal_sparks(lake, cluster: SpeedLayerCluster, gateway: str, path: str,  # noqa: F811
                                  version: int) -> None:
    """The pipeline's table admitted again, sharded (a second worker; the tenant's shard limit at
    3/4 of the table's estimate, so two shards of its commits' files): a group-by and a filtered
    aggregate through the gateway, merged from the shards, equal Spark's on the same Delta version."""
    on_disk = sum(f.stat().st_size for f in Path(path).rglob("*.parquet") if "_delta_log" not in f.parts)
    estimate = on_disk * GlobalConfig().memory_expansion_factor  # the master's estimate of the version
    cluster.set_tenant("acme", TenantConfig(shard_max_bytes=int(estimate * 0.75)))
    cluster.start_worker("acme", "w2")
    client = cluster.client()
    eventually(lambda: len(client.workers("acme").workers) == 2, deadline_s=30)
    admitted = client.admit(delta_request("acme", "feed_sharded", path, version=version))
    eventually(lambda: (m := client.status("acme", "feed_sharded", admitted.epoch_id).epochs[0].message)
               .startswith("sharded into 2 shards") and ": 2 of 2 READY" in m, deadline_s=60)
    view = lake.unique_name("feed_v").replace("-", "_")  # a temp view name
    lake.spark.read.format("delta").option("versionAsOf", version).load(path).createOrReplaceTempView(view)
    with QueryClient(gateway, "acme", client_id="vs-spark") as queries:
        for sql in ("SELECT _offset % 4 AS bucket, count(*) AS n, sum(_offset) AS total, min(_offset) AS lo, "
                    "max(_offset) AS hi, avg(_offset) AS mean FROM {table} GROUP BY _offset % 4 ORDER BY bucket",
                    "SELECT count(*) AS n, sum(_offset) AS total, max(_topic) AS topic FROM {table} "
                    "WHERE _offset >= 17 AND _offset % 3 = 1"):
            spark_rows = [row.asDict() for row in lake.spark.sql(sql.format(table=view)).collect()]
            assert spark_rows and queries.query("feed_sharded", sql.format(table="feed_sharded")).to_pylist() == \
                spark_rows, sql
