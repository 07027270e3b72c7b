"""The SchemaRegistry gRPC service, driven by danube-client's own schema client and producers."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from danube import CompatibilityMode, DanubeClientBuilder, DispatchStrategy, SchemaType, SubType
from danube.proto import SchemaRegistry_pb2 as pb
from danube.proto import SchemaRegistry_pb2_grpc as pb_grpc

from danube_core.keys import (
    schema_compatibility_key, schema_index_key, schema_metadata_key, schema_subject_key, schema_version_key,
)
from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.schema_records import SchemaCompatibility, SchemaIndexEntry, SchemaMetadata, SchemaVersion
from danube_core.topics import TopicName
from tests.integration.broker_process import expect_status, running_broker

pytestmark = pytest.mark.integration

V1 = {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}
V2 = {**V1, "properties": {**V1["properties"], "amount": {"type": "number"}}}  # adds an optional field
V3 = {**V2, "required": ["order_id", "amount", "currency"],
      "properties": {**V2["properties"], "currency": {"type": "string"}}}  # a new required field


@pytest.fixture(scope="module")
def broker(etcd_endpoint, tmp_path_factory):
    with running_broker(etcd_endpoint, tmp_path_factory, "schemas") as proc:
        yield proc


def _text(schema: dict) -> bytes:
    return json.dumps(schema).encode()


async def _register(client, subject: str, schema: dict) -> int:
    return await (client.schema().register_schema(subject).with_type(SchemaType.JSON_SCHEMA)
                  .with_schema_data(_text(schema)).execute())


def test_subject_lifecycle_through_the_official_client(broker, etcd_endpoint, unique_name):
    subject = unique_name("orders")

    async def scenario() -> int:
        client = await DanubeClientBuilder().service_url(broker.url).build()
        registry = client.schema()
        schema_id = await _register(client, subject, V1)
        assert await _register(client, subject, V1) == schema_id  # same schema: same id, no new version
        assert await _register(client, subject, V2) == schema_id
        latest = await registry.get_latest_schema(subject)
        assert (latest.schema_id, latest.version, latest.schema_type) == (schema_id, 2, "json_schema")
        assert json.loads(latest.schema_definition) == V2
        first = await registry.get_schema_version(schema_id, 1)
        assert json.loads(first.schema_definition) == V1
        assert await registry.list_versions(subject) == [1, 2]

        compatible, errors = await registry.check_compatibility(subject, _text(V3), SchemaType.JSON_SCHEMA)
        assert not compatible and any("'currency' is required" in e for e in errors)
        await expect_status(grpc.StatusCode.FAILED_PRECONDITION, _register(client, subject, V3), "backward", "currency")
        assert await registry.list_versions(subject) == [1, 2]

        assert (await registry.set_compatibility_mode(subject, CompatibilityMode.NONE))[0]
        assert await _register(client, subject, V3) == schema_id
        assert (await registry.delete_schema_version(subject, 2))[0]
        assert await registry.list_versions(subject) == [1, 3]
        return schema_id

    schema_id = asyncio.run(scenario())
    with EtcdMetadataStore(etcd_endpoint) as store:  # the keys and JSON of spec §5.6
        index_key, meta_key = schema_index_key(schema_id), schema_metadata_key(subject)
        assert SchemaIndexEntry.from_json(store.get(index_key), index_key).subject == subject
        meta = SchemaMetadata.from_json(store.get(meta_key), meta_key)
        assert (meta.id, meta.latest_version, meta.compatibility_mode) == (schema_id, 3, "None")
        assert [v.version for v in meta.versions] == [1, 3]
        assert store.get(schema_version_key(subject, 2)) is None
        version_key = schema_version_key(subject, 3)
        stored = SchemaVersion.from_json(store.get(version_key), version_key)
        assert stored.schema_def.kind == "JsonSchema" and json.loads(stored.schema_def.raw_schema) == V3
        assert stored.fingerprint.startswith("sha256:")
        mode_key = schema_compatibility_key(subject)
        assert SchemaCompatibility.from_json(store.get(mode_key), mode_key).mode == "none"


def test_producer_with_a_schema_subject_stamps_its_messages(broker, etcd_endpoint, unique_name):
    subject, topic = unique_name("events"), f"/default/{unique_name('events')}"

    async def scenario() -> list:
        client = await DanubeClientBuilder().service_url(broker.url).build()
        schema_id = await _register(client, subject, V1)
        await _register(client, subject, V2)
        consumer = (client.new_consumer().with_topic(topic).with_consumer_name("reader")
                    .with_subscription("schema-check").with_subscription_type(SubType.EXCLUSIVE).build())
        producer = (client.new_producer().with_topic(topic).with_name("stamped").with_schema_subject(subject)
                    .with_dispatch_strategy(DispatchStrategy.RELIABLE).build())
        await producer.create()
        await consumer.subscribe()
        queue = await consumer.receive()
        await producer.send(_text({"order_id": "o-1"}))
        message = await asyncio.wait_for(queue.get(), 30)
        await consumer.ack(message)
        await producer.close()
        await consumer.close()
        return [schema_id, message.schema_id, message.schema_version]

    schema_id, stamped_id, stamped_version = asyncio.run(scenario())
    assert (stamped_id, stamped_version) == (schema_id, 2)
    with EtcdMetadataStore(etcd_endpoint) as store:  # the auto-created topic records its subject (§6.1)
        assert store.get(schema_subject_key(TopicName.parse(topic))) == json.dumps(subject).encode()


def test_bad_schema_requests_get_clear_statuses(broker, unique_name):
    subject = unique_name("bad")

    async def scenario() -> None:
        async with grpc.aio.insecure_channel(broker.url.removeprefix("http://")) as channel:
            stub = pb_grpc.SchemaRegistryStub(channel)
            register = pb.RegisterSchemaRequest
            await expect_status(grpc.StatusCode.INVALID_ARGUMENT,
                                stub.RegisterSchema(register(subject=subject, schema_type="xml",
                                                             schema_definition=b"<a/>")),
                                "schema_type", "'xml'")
            await expect_status(grpc.StatusCode.INVALID_ARGUMENT,
                                stub.RegisterSchema(register(subject=subject, schema_type="json_schema",
                                                       schema_definition=b"{not json")),
                                "schema_definition", "not valid JSON")
            await expect_status(grpc.StatusCode.INVALID_ARGUMENT,
                                stub.RegisterSchema(register(subject="", schema_type="string")), "subject")
            await expect_status(grpc.StatusCode.NOT_FOUND,
                                stub.GetLatestSchema(pb.GetLatestSchemaRequest(subject=subject)), subject)
            await expect_status(grpc.StatusCode.NOT_FOUND, stub.GetSchema(pb.GetSchemaRequest(schema_id=2**63)),
                                str(2**63))
            await stub.RegisterSchema(register(subject=subject, schema_type="string"))
            await expect_status(grpc.StatusCode.FAILED_PRECONDITION,
                                stub.DeleteSchemaVersion(pb.DeleteSchemaVersionRequest(subject=subject, version=1)),
                                "latest version")
            await expect_status(grpc.StatusCode.INVALID_ARGUMENT, stub.SetCompatibilityMode(
                pb.SetCompatibilityModeRequest(subject=subject, compatibility_mode="sideways")), "sideways")
            await expect_status(grpc.StatusCode.UNIMPLEMENTED, stub.ConfigureTopicSchema(
                pb.ConfigureTopicSchemaRequest(topic_name="/default/t", schema_subject=subject)), "not supported")

    asyncio.run(scenario())
