"""One master, real worker processes: admission to READY on two workers with the right row count."""

from __future__ import annotations

import grpc
import pytest

from speedlayer.client import delta_request
from tests.rig import eventually
from tests.speedlayer.cluster import ready_workers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_admitted_delta_table_is_ready_on_two_workers(cluster_factory, delta_table):
    path = delta_table(rows=3000, partitions=3, appends=2)
    cluster = cluster_factory()
    cluster.start_master("m1")
    for worker in ("w1", "w2", "w3"):
        cluster.start_worker("acme", worker)
    client = cluster.client()
    eventually(lambda: len(client.workers("acme").workers) == 3, deadline_s=30)

    reply = client.admit(delta_request("acme", "orders", path))
    assert reply.status == "ASSIGNED", reply
    assert reply.epoch_id.startswith("v1-")
    ready = eventually(lambda: (r := ready_workers(client, "acme", "orders", reply.epoch_id)) and len(r) == 2 and r,
                       deadline_s=60)
    assert set(ready.values()) == {3000}

    again = client.admit(delta_request("acme", "orders", path))
    assert again.epoch_id == reply.epoch_id and again.status == "ASSIGNED"
    epoch = client.status("acme", "orders", reply.epoch_id).epochs[0]
    assert (epoch.total_rows, epoch.file_count, epoch.version) == (3000, 6, 1)

    only_day = client.admit(delta_request("acme", "orders", path, partitions=[{"day": "2024-01-02"}]))
    assert only_day.epoch_id != reply.epoch_id
    ready = eventually(lambda: (r := ready_workers(client, "acme", "orders", only_day.epoch_id)) and len(r) == 2 and r,
                       deadline_s=60)
    assert set(ready.values()) == {1000}


def test_malformed_and_unsupported_requests(cluster_factory, delta_table):
    from speedlayer.api.v1 import management_service_pb2 as mg

    cluster = cluster_factory()
    cluster.start_master("m1")
    client = cluster.client(deadline_s=10)
    path = delta_table(rows=10)
    cases = [
        (delta_request("", "orders", path), grpc.StatusCode.INVALID_ARGUMENT),
        (delta_request("acme", "bad/name", path), grpc.StatusCode.INVALID_ARGUMENT),
        (mg.AdmitDatasetRequest(tenant_id="acme", dataset_id="orders"), grpc.StatusCode.INVALID_ARGUMENT),
        (delta_request("acme", "orders", path, partitions=[{"nope": "1"}]), grpc.StatusCode.INVALID_ARGUMENT),
        (delta_request("acme", "orders", path + "-missing"), grpc.StatusCode.FAILED_PRECONDITION),
        (mg.AdmitDatasetRequest(tenant_id="acme", dataset_id="orders", source=mg.DataSourceIdentifier(
            olap_table=mg.OlapTable(instance="sr", database="d", table="t"))), grpc.StatusCode.UNIMPLEMENTED),
    ]
    for request, code in cases:
        with pytest.raises(grpc.RpcError) as caught:
            client.admit(request)
        assert caught.value.code() == code, (request, caught.value.details())
