"""A pipeline that names a speed-layer dataset announces its commits, and the master plans them.

Real Spark (the session-wide fixture) runs the pipeline into Delta; a real master process on an
etcd of its own follows the target table with a worker in this process. The master's poll is
set to an hour, so only the pipeline's announcement can make it plan the new version at once.
"""

from __future__ import annotations

import dataclasses

import pytest

from pipelines.speedlayer_feed import SpeedLayerFeed
from speedlayer.client import delta_request
from speedlayer.records import Announcement, AssignmentRecord, GlobalConfig
from tests.rig import eventually
from tests.speedlayer.cluster import SpeedLayerCluster
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
            "acme", "events", etcd_endpoints=cluster.etcd.endpoint))
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
