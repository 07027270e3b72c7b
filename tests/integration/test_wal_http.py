"""The read-only HTTP WAL server: what fsspec needs (index, HEAD, ranges) and nothing more,
and our broker serving its own WAL with it so a reader on another host reads the tail."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

import fsspec
import pytest
from danube import DanubeClientBuilder, DispatchStrategy

from broker.wal_http import WalHttpServer, parse_listen
from connectors.catalog import TopicCatalog
from connectors.planner import plan_tasks
from connectors.task_reader import read_task
from danube_core.records import BrokerRegistration
from tests.integration.broker_process import BrokerProcess
from tests.rig import eventually

pytestmark = pytest.mark.integration


@pytest.fixture
def served(tmp_path):
    (tmp_path / "default" / "t").mkdir(parents=True)
    (tmp_path / "default" / "t" / "wal.log").write_bytes(bytes(range(256)) * 4)
    (tmp_path.parent / "secret.txt").write_text("outside the root")
    server = WalHttpServer(str(tmp_path)).start()
    yield server
    server.stop()


def test_index_head_and_ranges_as_fsspec_reads_them(served):
    fs = fsspec.filesystem("http")
    base = served.url()
    assert fs.ls(base + "default/t/", detail=False) == [base + "default/t/wal.log"]
    assert fs.size(base + "default/t/wal.log") == 1024
    assert fs.cat_file(base + "default/t/wal.log", start=250, end=260) == bytes(range(250, 256)) + bytes(range(4))
    assert fs.cat_file(base + "default/t/wal.log") == bytes(range(256)) * 4


def test_nothing_outside_the_root_and_no_writes(served):
    for path in ("../secret.txt", "%2e%2e/secret.txt", "default/missing.log"):
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(served.url() + path)
        assert info.value.code == 404
    request = urllib.request.Request(served.url() + "default/t/wal.log", data=b"x", method="PUT")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request)
    assert info.value.code == 501
    bad_range = urllib.request.Request(served.url() + "default/t/wal.log", headers={"Range": "bytes=5000-"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(bad_range)
    assert info.value.code == 416


@pytest.mark.parametrize("value", ["7700", "host:", ":7700", "host:99999", "host:x"])
def test_bad_listen_address_is_named(value):
    with pytest.raises(ValueError, match=value.replace("(", r"\(")):
        parse_listen(value)


def test_broker_serves_its_wal_and_readers_find_the_tail_through_it(etcd_endpoint, metadata, tmp_path, unique_name):
    cloud = tmp_path / "cloud"
    proc = BrokerProcess(etcd_endpoint, tmp_path, "served", str(cloud), wal_cloud={
        "wal": {"dir": str(tmp_path / "served-wal"), "http_listen": "127.0.0.1:0",
                "file_sync": {"interval_ms": 50, "durable": True}},
        "uploader": {"interval_seconds": 3600, "root_prefix": "/danube-data"},  # all in the WAL
        "cloud": {"backend": "fs", "root": str(cloud)},
    }).start()
    topic = f"/default/{unique_name('served')}"
    try:
        registration = BrokerRegistration.from_json(metadata.get(f"/cluster/register/{proc.broker_id}"), "reg")
        assert registration.wal_url.startswith("http://127.0.0.1:")

        async def produce() -> None:
            client = await DanubeClientBuilder().service_url(proc.url).build()
            producer = (client.new_producer().with_topic(topic).with_name("p")
                        .with_dispatch_strategy(DispatchStrategy.RELIABLE).build())
            await producer.create()
            for i in range(25):
                await producer.send(f"m-{i}".encode(), None)

        asyncio.run(produce())
        cat = TopicCatalog(metadata, root_prefix="/danube-data", storage_url=cloud.as_uri(), storage_options={},
                           wal_root="auto", fail_on_data_loss=True)
        latest = eventually(lambda: cat.latest_offsets([topic])[topic] == 25 and cat.latest_offsets([topic]), 20)
        plan = plan_tasks(cat.snapshots({topic: 0}, latest), {topic: 0}, latest, max_partition_bytes=1 << 20,
                          fail_on_data_loss=True)
        assert all(t.url.startswith(registration.wal_url) for t in plan.tasks)
        payloads = [p for t in plan.tasks for b in read_task(t, ["payload"]) for p in b.column(0).to_pylist()]
        assert payloads == [f"m-{i}".encode() for i in range(25)]
    finally:
        proc.stop()
