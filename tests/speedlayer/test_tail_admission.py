"""Admitting a dataset with its topic's tail through a real master (etcd, the master process and its
tail process checking the pipeline file): each bad input refused with the field named, nothing
persisted; a good one admitted with the offsets of its version in the epoch's plan."""

from __future__ import annotations

import json

import grpc
import pyarrow as pa
import pytest

from danube_core.keys import namespace_topic_key
from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.schema_registry import register_schema
from speedlayer.api.v1 import management_service_pb2 as mg
from speedlayer.clients import delta_request
from speedlayer.master.state import decode_plan
from speedlayer.records import TenantConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TOPIC = "/default/tail-admission"


def write_table(path: str, user_metadata: list[str | None]) -> None:
    from deltalake import CommitProperties, write_deltalake

    for i, meta in enumerate(user_metadata):
        props = CommitProperties(custom_metadata={"userMetadata": meta}) if meta else None
        write_deltalake(path, pa.table({"_topic": [TOPIC], "_offset": pa.array([i], pa.int64())}), mode="append",
                        commit_properties=props)


def pipeline(etcd: str, root, name: str = "tailadm", subject: str = "tailadm", topics: list[str] | None = None) -> str:
    return json.dumps({
        "name": name,
        "source": {"etcd_endpoints": etcd, "storage_url": str(root / "storage"), "topics": topics or [TOPIC],
                   "subscription": name},
        "decode": {"format": "json", "subject": subject},
        "target": {"path": str(root / "target")}, "quarantine": {"path": str(root / "quarantine")},
        "checkpoint": str(root / "checkpoint"),
    })


@pytest.fixture
def admit(cluster_factory, etcd_endpoint, tmp_path):
    cluster = cluster_factory()
    cluster.start_master("m1")
    client = cluster.client(deadline_s=120)
    (tmp_path / "storage").mkdir()

    def admit_with(table: str, text: str, limit_rows: int = 1000, tenant: str = "acme") -> mg.AdmitDatasetResponse:
        return client.admit(delta_request(tenant, "orders", table, tail=mg.TailOptions(
            pipeline_config=text, limit_rows=limit_rows)))

    yield admit_with, cluster
    client.close()


def refusal(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code(), err.value.details() or ""


def test_bad_tails_are_refused_naming_the_field_and_a_good_one_is_planned(admit, etcd_endpoint, tmp_path):
    admit_with, cluster = admit
    plain, fed = str(tmp_path / "plain"), str(tmp_path / "fed")
    write_table(plain, [None, None])
    offsets = json.dumps({"pipeline": "tailadm", "offsets": {TOPIC: {"start": 0, "end": 2}}})
    write_table(fed, [offsets])
    text = pipeline(etcd_endpoint, tmp_path)

    code, said = refusal(lambda: admit_with(fed, text, limit_rows=0))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "tail.limit_rows=0" in said
    code, said = refusal(lambda: admit_with(plain, text))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and f"source.delta_table.table_uri {plain}" in said
    code, said = refusal(lambda: admit_with(fed, text))  # the subject is not registered yet
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "decode.subject" in said and "'tailadm'" in said

    with EtcdMetadataStore(etcd_endpoint) as metadata:
        register_schema(metadata, "tailadm", "JsonSchema", json.dumps({"type": "object", "properties": {}}))
        namespace_key = namespace_topic_key(TOPIC)
        metadata.put(namespace_key, b"null")  # the topic exists in the namespace index
        try:
            cluster.set_tenant("acme", TenantConfig(topic_namespaces=("billing",)))
            code, said = refusal(lambda: admit_with(fed, text))
            assert code == grpc.StatusCode.PERMISSION_DENIED and "source.topics" in said and "'default'" in said
            cluster.set_tenant("acme", TenantConfig())
            code, said = refusal(lambda: admit_with(fed, pipeline(etcd_endpoint, tmp_path, name="other")))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "name 'other' is not the pipeline" in said
            assert not cluster.metadata.get_prefix(cluster.keys.dataset_assignments_prefix("acme", "orders"))

            reply = admit_with(fed, text)
            assert reply.status in ("PLANNED", "ASSIGNED")
            plan = decode_plan(cluster.metadata.get(cluster.keys.plan("acme", "orders", reply.epoch_id)))
            assert json.loads(plan.tail)["offsets"] == {TOPIC: 2}
        finally:
            metadata.delete(namespace_key)
