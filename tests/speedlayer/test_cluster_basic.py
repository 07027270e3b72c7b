"""One master, real worker processes: admission to READY on two workers with the right row count."""

from __future__ import annotations

import itertools

import grpc
import pytest

from speedlayer.clients import delta_request
from tests.rig import eventually
from devstack.speedlayer_cluster import ready_workers

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


def test_quotas_tenant_isolation_and_unfaithful_tables(cluster_factory, delta_table, tmp_path):
    from deltalake import DeltaTable, TableFeatures

    from speedlayer.records import GlobalConfig, TenantConfig

    path = delta_table(rows=2000)
    cluster = cluster_factory()
    cluster.start_master("m1")
    cluster.start_worker("other", "wb1")
    client = cluster.client(deadline_s=10)
    eventually(lambda: len(client.workers("other").workers) == 1, deadline_s=30)

    # Another tenant's workers never get acme's epoch: it waits, PLANNED, for an acme worker.
    waiting = client.admit(delta_request("acme", "orders", path))
    assert waiting.status == "PLANNED" and "no eligible worker" in waiting.message
    cluster.start_worker("acme", "wa1")
    ready = eventually(lambda: ready_workers(client, "acme", "orders", waiting.epoch_id), deadline_s=60)
    assert ready == {"wa1": 2000}

    # Over quota (tenant, then global): refused before anything is persisted.
    used = client.quota("acme").memory_used_bytes
    assert used > 0
    client.quota("acme", memory_quota_bytes=used + 10)
    fresh = (f"day{n}" for n in itertools.count())  # a retry admits a new dataset (see _refused_as)
    day = [{"day": "2024-01-02"}]
    refused = eventually(lambda: _refused_as(client, "acme", next(fresh), path, grpc.StatusCode.FAILED_PRECONDITION,
                                             partitions=day), deadline_s=10)
    assert cluster.metadata.get_prefix(cluster.keys.dataset_assignments_prefix("acme", refused)) == []
    client.quota("acme", memory_quota_bytes=0)
    cluster.set_global(GlobalConfig(reassign_delay_s=1.0, memory_quota_bytes=used + 10))
    eventually(lambda: _refused_as(client, "other", next(fresh), path, grpc.StatusCode.FAILED_PRECONDITION,
                                   partitions=day), deadline_s=10)
    cluster.set_global(GlobalConfig(reassign_delay_s=1.0))

    # Cross-tenant source: outside the tenant's roots.
    cluster.set_tenant("other", TenantConfig(source_roots=(str(tmp_path / "other-tables"),)))
    eventually(lambda: _refused_as(client, "other", next(fresh), path, grpc.StatusCode.PERMISSION_DENIED),
               deadline_s=10)
    # Cross-tenant status: acme's epoch is not found under tenant other.
    assert _refused(client, None, status=("other", "orders", waiting.epoch_id)) == grpc.StatusCode.NOT_FOUND

    # A table with deletion vectors cannot be loaded faithfully.
    dv = delta_table(rows=10, name="with_dv")
    DeltaTable(dv).alter.add_feature(TableFeatures.DeletionVectors, allow_protocol_versions_increase=True)
    assert _refused(client, delta_request("acme", "dv", dv)) == grpc.StatusCode.FAILED_PRECONDITION


def _refused_as(client, tenant: str, dataset: str, path: str, code: grpc.StatusCode, **request) -> str | None:
    """`dataset` when its admission is refused with `code`. A quota or root reaches the master
    through its etcd watch, a moment after it is set, and an admission that came first stays
    admitted (asked again, it answers as before): a retry must ask for another dataset."""
    return dataset if _refused(client, delta_request(tenant, dataset, path, **request)) == code else None


def _refused(client, request, status=None):
    try:
        if status:
            client.status(*status)
        else:
            client.admit(request)
    except grpc.RpcError as exc:
        return exc.code()
    return None
