"""A successful `python -m pipelines run` ends without an ERROR or a traceback.

Every run used to end with "ERROR StreamingQueryListenerBus: Listener
PythonStreamingQueryListenerWrapper threw an exception ... Py4JException": the process exited
with listener events still queued for connectors' Python `DanubeCursorCommitter`, and the JVM's
shutdown hook delivered them after Python had gone. It happens only when the Python process
exits with its session, so this runs the CLI as a subprocess (one short Spark start) on a
topic built in the broker's layout with the session's etcd.
"""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
import yaml

from danube_core.keys import cursor_key
from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.objectstore import ObjectStore
from danube_core.records import parse_cursor
from devstack import REPO_ROOT
from tests.topic_builder import TopicBuilder

pytestmark = [pytest.mark.spark, pytest.mark.slow]

# As the session-wide test session: small and patient on a busy 2-core machine.
SMALL_SPARK = {
    "spark.master": "local[2]",
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.python.authenticate.socketTimeout": "120s",
}


def test_successful_run_logs_no_listener_error_at_exit(etcd_endpoint, tmp_path, unique_name):
    topic = f"/default/{unique_name('quiet')}"
    name = unique_name("quiet")
    with EtcdMetadataStore(etcd_endpoint) as metadata:
        builder = TopicBuilder(metadata, ObjectStore(str(tmp_path / "objects")), str(tmp_path / "wal"), topic,
                               broker_id=random.getrandbits(63))
        try:
            builder.append(5)
            builder.upload()
            path = tmp_path / "quiet.yaml"
            path.write_text(yaml.safe_dump({
                "name": name,
                "source": {"etcd_endpoints": etcd_endpoint, "storage_url": str(tmp_path / "objects"),
                           "topics": [topic], "subscription": name, "starting_offsets": "earliest"},
                "decode": {"format": "raw"},
                "target": {"path": str(tmp_path / "target")},
                "quarantine": {"path": str(tmp_path / "quarantine")},
                "checkpoint": str(tmp_path / "checkpoint"),
                "trigger": {"mode": "availableNow"},
                "spark_conf": SMALL_SPARK,
            }))
            done = subprocess.run([sys.executable, "-m", "pipelines", "run", str(path)], cwd=REPO_ROOT,
                                  capture_output=True, text=True, timeout=600)
            output = done.stdout + done.stderr
            assert done.returncode == 0, output[-3000:]
            assert f"pipeline {name} finished" in output
            assert "ERROR StreamingQueryListenerBus" not in output, output[-3000:]
            assert "Traceback" not in output and " ERROR " not in output, output[-3000:]
            key = cursor_key(topic, name)
            assert parse_cursor(metadata.get(key), key) == 4
        finally:
            builder.close()
