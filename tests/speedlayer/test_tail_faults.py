"""A dataset's topic tail under faults, with real processes: etcd and our broker
(`devstack.EmbeddedStack`), a master, two workers (each tail in its worker's tail process) and a
gateway (`devstack.EmbeddedSpeedLayer`). No Spark: the pipeline's table is committed with
deltalake from the tail feed's own split (`devstack.tail_table`), and the orders are plain JSON
the tail splits in Arrow.

* the worker holding the tail killed -9: the master places the epoch on the other worker, whose
  tail reads again from the epoch's offsets, so the answer counts every message once;
* the topic deleted (`python -m broker.admin topics delete`), or its schema gone from the
  registry so a new message no longer decodes: the tail's state in the answer says `error: ...`
  naming it while the epoch and the rows the tail already held keep answering.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.schema_registry import register_schema
from devstack import REPO_ROOT
from devstack.broker_stack import EmbeddedStack
from devstack.demo import ORDER_SCHEMA
from devstack.speedlayer_stack import EmbeddedSpeedLayer
from devstack.tail_table import commit_epoch, pipeline_file, produce_orders
from speedlayer.clients.query_client import QueryClient
from tests.rig import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

HEAD, TAIL = 20, 30  # the epoch holds offsets [0, HEAD); the tail reads the next TAIL
SQL = "SELECT count(*) AS n, count(DISTINCT _offset) AS d, max(_offset) AS hi FROM {dataset}"


class Rig:
    def __init__(self, stack: EmbeddedStack, layer: EmbeddedSpeedLayer, name: str, topic: str) -> None:
        self.stack, self.layer, self.name, self.topic = stack, layer, name, topic
        self.client = QueryClient(layer.gateway, "acme", client_id=f"faults-{name}")
        self.sent = 0

    def produce(self, count: int) -> None:
        self.sent += asyncio.run(produce_orders(self.stack.service_url, self.topic, self.sent, count, name=self.name))

    def ask(self, committed_only: bool = False) -> dict:
        table = self.client.query(self.name, SQL.format(dataset=self.name), committed_only=committed_only)
        row = table.to_pylist()[0]
        meta = table.schema.metadata or {}
        tail = json.loads(meta.get(b"speedlayer.tail", b"{}"))
        row.update(epoch=meta.get(b"speedlayer.epoch", b"").decode(), state=str(tail.get("state", "")),
                   tail_rows=tail.get("rows", 0))
        return row

    def holders(self) -> set[str]:
        """The workers with a READY replica of the dataset's newest epoch."""
        status = self.layer._client.status("acme", self.name)  # type: ignore[union-attr]
        return {r.worker_id for e in status.epochs[-1:] for r in e.replicas if r.state == "READY"}


@pytest.fixture
def rig(tmp_path, unique_name):
    name = unique_name("tailfault").replace("-", "_")
    topic = f"/default/{unique_name('tail-fault')}"
    with EmbeddedStack(tmp_path / "stack") as stack:
        with EtcdMetadataStore(stack.etcd_endpoint) as metadata:
            register_schema(metadata, name, "JsonSchema", json.dumps(ORDER_SCHEMA))
        layer = EmbeddedSpeedLayer(tmp_path / "speedlayer", stack.etcd_endpoint, tenant="acme")
        rig = Rig(stack, layer, name, topic)
        try:
            rig.produce(HEAD + TAIL)
            data = pipeline_file(stack.etcd_endpoint, stack.storage_url, tmp_path, name, topic)
            commit_epoch(data, HEAD)
            layer.start(workers=2, worker_memory_mb=256, worker_threads=1)
            layer.admit(name, data["target"]["path"], tail_pipeline=json.dumps(data))
            first = eventually(lambda: (a := rig.ask())["n"] == HEAD + TAIL and a, deadline_s=90)
            assert (first["d"], first["hi"], first["tail_rows"], first["state"]) == (HEAD + TAIL, HEAD + TAIL - 1,
                                                                                     TAIL, "following")
            yield rig
        finally:
            rig.client.close()
            layer.stop()


def test_a_tail_holder_killed_is_rebuilt_on_another_worker_from_the_epochs_offsets(rig):
    (victim,) = rig.holders()
    rig.layer.kill(f"worker-{victim}")
    rig.produce(10)  # beyond what the killed tail read
    survivor = eventually(lambda: (h := rig.holders()) and victim not in h and h, deadline_s=90)
    answer = eventually(lambda: (a := rig.ask())["n"] == rig.sent and a, deadline_s=60)
    assert victim not in survivor
    assert (answer["d"], answer["hi"], answer["tail_rows"]) == (rig.sent, rig.sent - 1, rig.sent - HEAD)
    assert rig.ask(committed_only=True)["n"] == HEAD


def test_a_schema_gone_from_the_registry_is_a_named_error_and_the_epoch_keeps_answering(rig):
    with EtcdMetadataStore(rig.stack.etcd_endpoint) as metadata:
        metadata.delete_prefix(f"/schemas/{rig.name}")
    rig.produce(5)  # its read needs the subject's schema
    answer = eventually(lambda: (a := rig.ask())["state"].startswith("error:") and a, deadline_s=60)
    assert f"subject {rig.name!r} does not exist" in answer["state"], answer["state"]
    assert (answer["n"], answer["d"]) == (HEAD + TAIL, HEAD + TAIL)  # what the tail held, not the new 5
    assert rig.ask(committed_only=True)["n"] == HEAD


def test_a_deleted_topic_is_a_named_state_and_the_epoch_keeps_answering(rig):
    done = subprocess.run([sys.executable, "-m", "broker.admin", "--etcd", rig.stack.etcd_endpoint,
                           "topics", "delete", rig.topic], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    answer = eventually(lambda: (a := rig.ask())["state"].startswith("error:") and a, deadline_s=60)
    assert f"TopicDeletedError: topic {rig.topic} was deleted" in answer["state"], answer["state"]
    assert (answer["n"], answer["d"]) == (HEAD + TAIL, HEAD + TAIL)  # the rows the tail held
    assert rig.ask(committed_only=True)["n"] == HEAD
