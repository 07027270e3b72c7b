"""The seed's Iceberg source: a pyiceberg SQL catalog on sqlite, admitted and loaded by real processes."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from speedlayer.api.v1 import management_service_pb2 as mg
from speedlayer.sources.iceberg import IcebergTableSource
from tests.rig import eventually
from devstack.speedlayer_cluster import ready_workers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture
def catalog(tmp_path):
    from pyiceberg.catalog.sql import SqlCatalog

    properties = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/wh"}
    catalog = SqlCatalog("lake", **{k: v for k, v in properties.items() if k != "type"})
    catalog.create_namespace("sales")
    rows = pa.table({"id": pa.array(range(500), pa.int64()), "region": [f"r{i % 4}" for i in range(500)]})
    table = catalog.create_table("sales.orders", schema=rows.schema)
    table.append(rows)
    table.append(rows)
    return properties


def request(replication: int = 0) -> mg.AdmitDatasetRequest:
    source = mg.DataSourceIdentifier(iceberg_table=mg.IcebergTable(catalog="lake", database="sales", table="orders"))
    return mg.AdmitDatasetRequest(tenant_id="acme", dataset_id="orders", source=source, replication=replication)


def test_connector_resolves_current_snapshot(catalog):
    resolved = IcebergTableSource({"lake": catalog}).resolve(request().source, [])
    assert (resolved.total_rows, resolved.file_count) == (1000, 2)
    assert all(not f.uri.startswith("file://") for f in resolved.source.iceberg.files)
    assert pa.ipc.read_schema(pa.py_buffer(resolved.arrow_schema)).names == ["id", "region"]


def test_iceberg_table_ready_on_workers(cluster_factory, catalog):
    cluster = cluster_factory()
    config = json.loads(cluster.config_path.read_text())
    config["sources"] = {"iceberg": {"catalogs": {"lake": catalog}}}
    cluster.config_path.write_text(json.dumps(config))
    cluster.start_master("m1")
    cluster.start_worker("acme", "w1")
    cluster.start_worker("acme", "w2")
    client = cluster.client()
    eventually(lambda: len(client.workers("acme").workers) == 2, deadline_s=30)
    reply = client.admit(request())
    assert reply.status == "ASSIGNED"
    ready = eventually(lambda: (r := ready_workers(client, "acme", "orders", reply.epoch_id)) and len(r) == 2 and r,
                       deadline_s=60)
    assert set(ready.values()) == {1000}
