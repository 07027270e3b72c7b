"""A pipeline's driver killed mid-stream, through our broker: `python -m pipelines run` as a
real process, its whole process group (driver, JVM, Python workers) SIGKILLed after its second
Delta commit, then the same pipeline run again: every message exactly once, and the etcd cursor
never ahead of Delta.

Both runs are processes and the tables are read without Spark (deltalake), so the test takes no
turn of the suite's one Spark session: it spends most of its time waiting on the two runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from danube_core.keys import cursor_key
from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.records import parse_cursor
from danube_core.schema_registry import register_schema
from devstack import REPO_ROOT
from devstack.broker_stack import EmbeddedStack
from devstack.demo import ORDER_SCHEMA
from pipelines.config import load_config
from tests.pipeline_files import assert_exactly_once, publish_orders, run_pipeline_process, stack_pipeline_file
from tests.rig import eventually

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

MESSAGES = 150


def delta_commits(table: Path) -> int:
    log = table / "_delta_log"
    return len(list(log.glob("*.json"))) if log.exists() else 0


def delta_rows(path: str) -> list[dict]:
    """A Delta table's rows, [] where no table was written yet."""
    from deltalake import DeltaTable

    if not (Path(path) / "_delta_log").exists():
        return []
    return DeltaTable(path).to_pyarrow_table().to_pylist()


def test_driver_killed_mid_stream_restarts_exactly_once(tmp_path, unique_name):
    topic, name, subject = f"/default/{unique_name('kill')}", unique_name("kill"), unique_name("orders")
    with EmbeddedStack(tmp_path / "stack") as stack, EtcdMetadataStore(stack.etcd_endpoint) as metadata:
        register_schema(metadata, subject, "JsonSchema", json.dumps(ORDER_SCHEMA))
        orders = publish_orders(stack, topic, MESSAGES)
        streaming = stack_pipeline_file(stack, tmp_path, name, topic, subject,
                                        trigger={"mode": "processingTime", "interval": "500 ms"},
                                        source={"max_messages_per_trigger": 15})
        with (tmp_path / "killed.log").open("w") as log:
            driver = subprocess.Popen([sys.executable, "-m", "pipelines", "run", str(streaming)], cwd=str(REPO_ROOT),
                                      stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            eventually(lambda: delta_commits(tmp_path / "target") >= 2 or driver.poll() is not None,
                       deadline_s=600, interval_s=0.2)
        finally:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(30)
        assert driver.returncode == -signal.SIGKILL, "the driver ended before it could be killed mid-stream"
        config = load_config(streaming)
        key = cursor_key(topic, name)
        raw = metadata.get(key)
        written = delta_rows(config.target.path) + delta_rows(config.quarantine.path)
        in_delta = max((row["_offset"] for row in written), default=-1)
        assert 0 <= in_delta < MESSAGES - 1, "killed mid-stream: some but not all batches written"
        assert raw is None or parse_cursor(raw, key) <= in_delta, "cursor ahead of Delta"

        # The same name (so the same Delta txnAppId and checkpoint), availableNow to the end.
        restarted = stack_pipeline_file(stack, tmp_path, name, topic, subject)
        run_pipeline_process(restarted, tmp_path / "restarted.log")
        assert_exactly_once(delta_rows(config.target.path), delta_rows(config.quarantine.path), orders, topic)
        assert parse_cursor(metadata.get(key), key) == MESSAGES - 1
