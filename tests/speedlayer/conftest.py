"""Speed layer tests. A cluster from `cluster_factory` keeps its keys under a key root of its own
on the session's etcd; a module that restarts etcd starts a cluster with an etcd of its own."""

from __future__ import annotations

import pyarrow as pa
import pytest

from devstack.speedlayer_cluster import SpeedLayerCluster


@pytest.fixture
def delta_table(tmp_path):
    """`make(rows, partitions=3, files_per_partition=1)` writes a partitioned Delta table; returns its path."""
    from deltalake import write_deltalake

    def make(rows: int = 1000, partitions: int = 3, appends: int = 1, name: str = "orders") -> str:
        path = str(tmp_path / name)
        per = rows // appends
        for batch in range(appends):
            ids = range(batch * per, (batch + 1) * per)
            table = pa.table({
                "id": pa.array(ids, pa.int64()),
                "day": [f"2024-01-{i % partitions + 1:02d}" for i in ids],
                "amount": pa.array([i * 0.5 for i in ids], pa.float64()),
            })
            write_deltalake(path, table, partition_by=["day"], mode="append")
        return path

    return make


@pytest.fixture(scope="module")
def moto_process():
    """moto's S3 server in a process of its own: delta-rs holds the GIL in some calls (e.g.
    `history`), which would deadlock against the session's in-process (threaded) moto server."""
    import subprocess
    import sys

    from danube_core.ports import free_port, wait_for_port
    from tests.conftest import MotoS3Server

    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port)
        server = MotoS3Server.__new__(MotoS3Server)  # its storage options and create_bucket, our process
        server.port, server.endpoint_url = port, f"http://127.0.0.1:{port}"
        yield server
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture
def cluster_factory(tmp_path_factory, request, etcd_endpoint):
    clusters: list[SpeedLayerCluster] = []

    def make(**kwargs) -> SpeedLayerCluster:
        cluster = SpeedLayerCluster(tmp_path_factory.mktemp("speedlayer"), etcd_endpoint=etcd_endpoint, **kwargs)
        clusters.append(cluster)
        return cluster

    yield make
    failed = getattr(request.node, "rep_call", None)
    for cluster in clusters:
        if failed is not None and failed.failed:
            print(cluster.dump_logs())
        cluster.stop()


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
