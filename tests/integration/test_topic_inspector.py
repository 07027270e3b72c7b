"""`TopicInspector` against real etcd and local files: what the explore notebook shows, without Spark."""

from __future__ import annotations

from pathlib import Path

import pytest

from connectors.cursor_commit import CursorWriter
from connectors.topic_inspector import (
    DescriptorRow, SealedRow, SubscriptionLag, TopicInspector, TopicOverview, rows,
)
from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.objectstore import ObjectStore
from tests.topic_builder import TopicBuilder

pytestmark = pytest.mark.integration


@pytest.fixture
def built(etcd_endpoint, tmp_path: Path, unique_name):
    """/ns/events: 20 + 10 frames in two objects, 5 more only in the WAL; cursor of `a` at 9."""
    namespace = unique_name("ns")
    storage = tmp_path / "cloud"
    metadata = EtcdMetadataStore(etcd_endpoint)
    builder = TopicBuilder(metadata, ObjectStore(str(storage)), str(tmp_path / "wal"), f"/{namespace}/events")
    builder.append(20)
    builder.upload()
    builder.append(10)
    builder.upload()
    builder.append(5)
    topic = str(builder.topic)
    CursorWriter(metadata, "a").commit({topic: 10})
    CursorWriter(metadata, "b").register(topic)
    options = {"etcd.endpoints": etcd_endpoint, "storage.url": str(storage), "namespace": namespace}
    inspector = TopicInspector.from_options(options)
    yield builder, topic, inspector
    inspector.close()
    metadata.close()


def test_overview_of_a_loaded_then_sealed_topic(built) -> None:
    builder, topic, inspector = built
    [loaded] = inspector.overview()
    assert (loaded.topic, loaded.partition, loaded.delivery, loaded.owner_broker) == (topic, None, "Reliable", builder.broker_id)
    assert (loaded.earliest_offset, loaded.latest_offset, loaded.wal_start) == (0, 35, 30)
    assert (loaded.objects, loaded.first_object_offset, loaded.last_object_offset) == (2, 0, 29)
    assert loaded.object_bytes == sum(d.size for d in builder.descriptors)
    assert (loaded.sealed, loaded.sealed_offset, loaded.subscriptions) == (False, None, 2)
    assert inspector.sealed_state(topic) is None

    builder.seal()
    [sealed] = inspector.overview()
    assert (sealed.sealed, sealed.sealed_offset, sealed.owner_broker, sealed.latest_offset) == (True, 34, None, 35)
    assert inspector.sealed_state(topic) == SealedRow(topic, True, 34, builder.broker_id,
                                                    builder.descriptors[-1].created_at)


def test_descriptors_are_listed_from_an_offset_and_bounded(built) -> None:
    builder, topic, inspector = built
    assert [(d.start_offset, d.end_offset, d.messages) for d in inspector.descriptors(topic)] == [(0, 19, 20), (20, 29, 10)]
    assert [d.start_offset for d in inspector.descriptors(topic, from_offset=1)] == [20]
    [first] = inspector.descriptors(topic, limit=1)
    assert first.object_id == builder.descriptors[0].object_id and first.index_entries == 1


def test_lag_per_subscription_in_messages_bytes_and_ms(built) -> None:
    builder, topic, inspector = built
    lag = {r.subscription: r for r in inspector.lag()}
    a, b = lag["a"], lag["b"]
    assert (a.cursor, a.next_offset, a.latest_offset, a.messages) == (9, 10, 35, 25)
    publish = {o: m.publish_time for o, m in builder.messages.items()}
    assert a.ms == publish[34] - publish[9] == 25 * (publish[1] - publish[0])
    assert a.bytes > 0 and (a.subscription_type, a.consumer_name) == ("Exclusive", "danube-spark")
    assert (b.cursor, b.next_offset, b.messages, b.bytes, b.ms) == (None, None, None, None, None)

    [missing] = inspector.lag(subscription="nobody")
    assert (missing.subscription, missing.subscription_type, missing.cursor) == ("nobody", None, None)


def test_a_cursor_past_the_head_shows_no_negative_lag(built) -> None:
    builder, topic, inspector = built
    CursorWriter(inspector.metadata, "ahead").commit({topic: 100})
    [ahead] = inspector.lag(subscription="ahead")
    assert (ahead.cursor, ahead.messages, ahead.bytes) == (99, 0, 0)


@pytest.mark.parametrize("record", [TopicOverview, DescriptorRow, SealedRow, SubscriptionLag])
def test_rows_and_spark_schemas_name_the_same_columns(record, built) -> None:
    builder, topic, inspector = built
    samples = {
        TopicOverview: lambda: inspector.overview(),
        DescriptorRow: lambda: inspector.descriptors(topic),
        SealedRow: lambda: [builder.seal() and inspector.sealed_state(topic)],
        SubscriptionLag: lambda: inspector.lag(),
    }[record]()
    columns = [c.split(" ")[0] for c in record.ddl().split(", ")]
    assert samples and all(list(row) == columns for row in rows(samples))
