"""`./spark-submit.sh run <pipeline.yaml>` itself, on a local master, over a hand-built topic.

The result is checked without a Spark session of our own: the Delta log's `add` actions carry
each file's record count, and the subscription cursor is read from etcd.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from danube_core.keys import cursor_key
from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.objectstore import ObjectStore
from danube_core.records import parse_cursor
from devstack import REPO_ROOT
from tests.topic_builder import TopicBuilder

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def delta_records(table: Path) -> int:
    """Rows in a Delta table (append-only here): the sum of numRecords over its add actions."""
    total = 0
    for commit in sorted((table / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                total += json.loads(action["add"]["stats"])["numRecords"]
    return total


def test_spark_submit_runs_a_pipeline_on_a_local_master(etcd_endpoint, tmp_path, unique_name):
    name = unique_name("submit")
    store = ObjectStore(str(tmp_path / "objects"))
    with EtcdMetadataStore(etcd_endpoint) as metadata:
        topic = TopicBuilder.with_backlog(metadata, store, str(tmp_path / "wal"), f"/default/{name}", 30, 12)
        config = {
            "name": name,
            "source": {"etcd_endpoints": etcd_endpoint, "storage_url": store.url, "topics": [topic.name],
                       "subscription": name, "starting_offsets": "earliest", "max_messages_per_trigger": 20},
            "decode": {"format": "raw"},
            "target": {"path": str(tmp_path / "target")},
            "quarantine": {"path": str(tmp_path / "quarantine")},
            "checkpoint": str(tmp_path / "checkpoint"),
            "trigger": {"mode": "availableNow"},
        }
        file = tmp_path / "pipeline.yaml"
        file.write_text(yaml.safe_dump(config))

        done = subprocess.run(
            [str(REPO_ROOT / "spark-submit.sh"), "run", str(file), "--master", "local[1]",
             "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=7"],
            cwd=str(tmp_path), capture_output=True, text=True, timeout=900,
        )

        assert done.returncode == 0, f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
        assert delta_records(tmp_path / "target") == 42
        assert len(list((tmp_path / "target" / "_delta_log").glob("*.json"))) == 3  # 20 + 20 + 2
        key = cursor_key(topic.name, name)
        assert parse_cursor(metadata.get(key), key) == 41
        assert (REPO_ROOT / "build" / "spark-submit" / "danube-spark.zip").exists()
        # The submitted --conf wins over the pipeline session's small-machine default (4): the
        # query's offset log records the value each batch ran with.
        assert shuffle_partitions(tmp_path / "checkpoint") == {"7"}
        assert "spark.sql.shuffle.partitions=7)" in done.stdout  # the driver's Python logs to stdout
        # Spark logs at WARN by default, and Ivy's report only comes with a download.
        assert [line for line in done.stderr.splitlines() if " INFO " in line] == [], done.stderr[-3000:]
        # The pipeline registers format("danube") although Spark finds it on its own (the
        # registered one carries the executors' environment): Spark's notice of that stays out.
        assert "replaced a" not in done.stderr, done.stderr[-3000:]
        assert ":: resolution report ::" not in done.stderr or "downloading " in done.stderr, done.stderr[-3000:]


def shuffle_partitions(checkpoint: Path) -> set[str]:
    """`spark.sql.shuffle.partitions` as recorded in each batch of a query's offset log."""
    values = set()
    for batch in (checkpoint / "offsets").iterdir():
        if batch.name.isdigit():
            metadata = json.loads(batch.read_text().splitlines()[1])  # line 0 is the log version
            values.add(metadata["conf"]["spark.sql.shuffle.partitions"])
    assert values, f"no batch in {checkpoint / 'offsets'}"
    return values
