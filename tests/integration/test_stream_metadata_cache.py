"""The streaming reader's driver plans from a `LocalCache`, against a real etcd and moto S3.

The driver-side methods Spark calls per trigger (`latestOffset`, `partitions`) run here in
process, with the etcd connection wrapped in a counting proxy, so every request that reaches
etcd is counted.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import statistics
import time
import uuid
from typing import Iterator

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from connectors import stream as stream_module
from connectors.batch import new_catalog
from connectors.partitions import plan_partitions, read_partition
from connectors.options import EtcdSettings, parse_options
from connectors.query_scope import QueryScope
from connectors.stream import DanubeStreamReader
from danube_core.cached_store import CachedMetadataStore
from danube_core.errors import ConfigError, DataLossError, MetadataCompactedError
from danube_core.keys import cursor_key, namespace_topic_key, subscription_key, subscriptions_prefix
from danube_core.metadata_etcd import EtcdMetadataStore
from danube_core.objectstore import ObjectStore
from danube_core.records import dump_cursor
from tests.rig import CountingStore, eventually
from tests.topic_builder import TopicBuilder

pytestmark = pytest.mark.integration

TRIGGERS = 100


@pytest.fixture
def env(etcd_endpoint, moto_s3, s3_bucket, tmp_path, unique_name) -> Iterator[dict]:
    root = f"/danube-cache-{uuid.uuid4().hex[:8]}"
    metadata = EtcdMetadataStore(etcd_endpoint)
    store = ObjectStore(f"s3://{s3_bucket}", moto_s3.storage_options)
    topic = f"/default/{unique_name('cached')}"
    builder = TopicBuilder(metadata, store, str(tmp_path / "wal"), topic, root_prefix=root)
    options = {
        "etcd.endpoints": etcd_endpoint, "rootPrefix": root, "storage.url": f"s3://{s3_bucket}",
        "storage.key": "testing", "storage.secret": "testing",
        "storage.client_kwargs.endpoint_url": moto_s3.endpoint_url,
        "storage.client_kwargs.region_name": "us-east-1",
        "walRoot": str(tmp_path / "wal"), "topic": topic, "subscription": unique_name("sub"),
    }
    yield {"metadata": metadata, "builder": builder, "options": options, "topic": topic, "bucket": s3_bucket,
           "storage_options": moto_s3.storage_options, "wal_root": str(tmp_path / "wal")}
    builder.close()
    metadata.delete_prefix(root + "/")
    metadata.close()


@pytest.fixture
def etcd_connections(monkeypatch) -> list[CountingStore]:
    """The counting proxies `EtcdSettings.connect` opened during the test, filled as the reader
    connects. Every call returns the first one, so `[0]` counts every etcd request the driver
    sends whichever part of it connects."""
    counted: list[CountingStore] = []

    def connect(self: EtcdSettings) -> CountingStore:
        counted.append(CountingStore(EtcdMetadataStore(self.endpoints)))
        return counted[0]

    monkeypatch.setattr(EtcdSettings, "connect", connect)
    return counted


def offsets_read(partitions) -> list[int]:
    return [o for p in partitions for batch in read_partition(p, False)
            for o in batch.column("offset").to_pylist()]


def test_a_stream_makes_no_etcd_range_reads_after_its_first_trigger(env, etcd_connections, monkeypatch):
    monkeypatch.setattr(stream_module, "LAG_RECORD_INTERVAL_S", 1e9)  # lag records: first trigger only
    builder = env["builder"]
    reader = DanubeStreamReader(parse_options({**env["options"], "startingOffsets": "earliest"}))
    start = reader.initialOffset()
    planning_s, after_first, read = [], None, []
    try:
        for trigger in range(TRIGGERS):
            builder.append(20)
            if trigger % 2:
                builder.upload()  # a new descriptor and `cur` every other trigger
            began = time.perf_counter()
            end = reader.latestOffset(start, ReadAllAvailable())
            partitions = reader.partitions(start, end)
            planning_s.append(time.perf_counter() - began)
            read.extend(offsets_read(partitions))
            reader.commit(end)
            start = end
            if after_first is None:
                after_first = dict(etcd_connections[0].calls)
        calls = etcd_connections[0].calls
        since = {m: calls.get(m, 0) - after_first.get(m, 0) for m in set(calls) | set(after_first)}
        assert [since.get(m, 0) for m in ("get_prefix", "get_range", "range_at")] == [0, 0, 0]
        # The first trigger listed the scope once per span: the topic's index entry, its storage
        # window and /topics keys, the registrations, broker states and its assignments.
        assert after_first.get("range_at", 0) <= 6, after_first
        # Writes go on reaching etcd: each trigger's cursor commit, compared against the cache
        # and (in the same transaction) against the subscription lock this process holds.
        assert since.get("get", 0) == 0 and since["guarded_put"] == TRIGGERS - 1
        assert read == list(range(len(read)))  # contiguous from 0: nothing skipped or repeated
        assert len(read) >= 20 * (TRIGGERS - 1)  # at most the last trigger's append not yet seen
        early, late = statistics.median(planning_s[1:21]), statistics.median(planning_s[-20:])
        assert late < 3 * early + 0.02, (early, late)  # flat while descriptors accumulate
    finally:
        reader.stop()


def test_a_trigger_sends_etcd_only_its_cursor_commit(env, etcd_connections, monkeypatch):
    """What the driver's etcd traffic per trigger is, once the cache is loaded: the commit."""
    monkeypatch.setattr(stream_module, "LAG_RECORD_INTERVAL_S", 1e9)
    builder = env["builder"]
    builder.append(10)
    reader = DanubeStreamReader(parse_options({**env["options"], "startingOffsets": "earliest"}))
    start = reader.initialOffset()
    try:
        end = reader.latestOffset(start, ReadAllAvailable())
        reader.partitions(start, end)
        reader.commit(end)  # as Spark does once the batch is in the commit log
        before = dict(etcd_connections[0].calls)
        builder.append(10)
        end2 = reader.latestOffset(end, ReadAllAvailable())
        reader.partitions(end, end2)
        reader.commit(end2)
        delta = {m: n - before.get(m, 0) for m, n in etcd_connections[0].calls.items() if n != before.get(m, 0)}
        assert delta == {"guarded_put": 1}, delta
    finally:
        reader.stop()


def test_catching_up_is_recorded_at_once_and_a_new_backlog_waits_for_the_interval(env):
    """The subscription record's lag (what the console and the broker's metrics show): a query
    that catches up within `LAG_RECORD_INTERVAL_S` of its first trigger records 0 then, not
    the backlog it started with (an AvailableNow run ended showing 60 behind at its cursor)."""
    builder, metadata, topic = env["builder"], env["metadata"], env["topic"]
    options = parse_options({**env["options"], "startingOffsets": "earliest"})
    key = subscription_key(topic, options.subscription)

    def recorded() -> int:
        return json.loads(metadata.get(key))["lag"]["messages"]

    builder.append(10)
    reader = DanubeStreamReader(options)
    start = reader.initialOffset()
    try:
        end = reader.latestOffset(start, ReadAllAvailable())
        assert recorded() == 10
        reader.partitions(start, end)
        reader.commit(end)
        assert reader.latestOffset(end, ReadAllAvailable()) == end
        assert recorded() == 0
        builder.append(5)
        reader.latestOffset(end, ReadAllAvailable())
        assert recorded() == 0  # within the interval: one etcd write per interval at most
    finally:
        reader.stop()


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_descriptor_the_cache_has_not_seen_only_delays_never_skips(env, fail_on_data_loss):
    """Regression guard: the cache still says 0..99 are uploaded; etcd knows 100..169 are, and
    retention has removed their WAL file. Planning from the cache alone would call 100..149
    lost (and skip them with failOnDataLoss=false); the re-check against etcd reads them."""
    builder, metadata, topic = env["builder"], env["metadata"], env["topic"]
    builder.append(100)
    builder.upload()
    builder.rotate()
    builder.append(50)
    builder.rotate()
    builder.append(20)
    options = parse_options({**env["options"], "failOnDataLoss": str(fail_on_data_loss).lower()})
    scope = QueryScope(metadata, options, name="frozen").start()
    scope.follow([topic])
    scope.close()  # frozen: it never sees what follows
    cache = CachedMetadataStore(metadata, scope.cache)
    builder.upload()
    os.remove(builder.file_path(1))  # retention, after the upload of 100..169
    stale, fresh = new_catalog(options, cache), new_catalog(options, metadata)
    partitions = plan_partitions(stale, options, {topic: 0}, {topic: 170}, recheck=fresh)
    assert offsets_read(partitions) == list(range(170))
    if fail_on_data_loss:
        with pytest.raises(Exception, match="100"):
            plan_partitions(stale, options, {topic: 0}, {topic: 170})
    else:
        skipped = offsets_read(plan_partitions(stale, options, {topic: 0}, {topic: 170}))
        assert skipped[:100] == list(range(100)) and len(skipped) < 170  # what the re-check prevents


def test_a_cursor_older_than_the_oldest_retained_descriptor_is_data_loss_named(env):
    """Retention deleted the descriptors (and WAL) holding 0..99 while the subscription's cursor
    still points into them: resuming there names the topic and the offsets it cannot read."""
    builder, metadata, topic = env["builder"], env["metadata"], env["topic"]
    builder.append(100)
    first = builder.upload()
    builder.rotate()
    builder.append(100)
    builder.upload()
    builder.rotate()
    metadata.delete(builder.storage_keys.object_key(builder.topic, first.start_offset))
    os.remove(builder.file_path(0))
    subscription = env["options"]["subscription"]
    metadata.put(cursor_key(builder.topic, subscription), dump_cursor(49))
    strict = DanubeStreamReader(parse_options({**env["options"], "startingOffsets": "cursor"}))
    try:
        start = strict.initialOffset()
        assert start["offsets"][topic] == 50
        with pytest.raises(Exception) as lost:
            end = strict.latestOffset(start, ReadAllAvailable())
            strict.partitions(start, end)
        message = str(lost.value)
        assert topic in message and re.search(r"\b50\b", message) and re.search(r"\b(99|100)\b", message), message
    finally:
        strict.stop()
    lenient = DanubeStreamReader(parse_options({**env["options"], "startingOffsets": "cursor",
                                                "failOnDataLoss": "false"}))
    try:
        start = lenient.initialOffset()
        end = lenient.latestOffset(start, ReadAllAvailable())
        assert offsets_read(lenient.partitions(start, end)) == list(range(100, 200))
        lenient.latestOffset(end, ReadAllAvailable())  # query progress names what was skipped so far
        assert lenient.reportLatestOffset()["skippedOffsets"] == {topic: 50}
    finally:
        lenient.stop()


def lose_watch_and_compact(reader: DanubeStreamReader, while_down) -> None:
    """Break the stream's cache watch (as a lost etcd stream does), run `while_down`, compact
    etcd past everything, and wait for the cache to have listed its spans again."""
    state = reader._state
    assert state is not None
    cache, etcd = state.scope.cache, state.metadata
    loads = cache.loads
    cache._on_lost(cache._generation, MetadataCompactedError("watch broken by the test", etcd.current_revision()))
    while_down()
    etcd.compact(etcd.current_revision())
    eventually(lambda: cache.loads > loads and cache.synced, deadline_s=30)


def test_a_compaction_past_the_cache_while_its_watch_is_down_relists_and_the_query_goes_on(env, monkeypatch):
    """The cache's watch breaks and etcd compacts past its revision meanwhile: the cache lists
    its spans again (the topic's window, its keys, the cluster keys) and the query reads every
    offset once, from objects uploaded while the watch was down too."""
    builder = env["builder"]
    monkeypatch.setattr(stream_module, "LAG_RECORD_INTERVAL_S", 1e9)
    reader = DanubeStreamReader(parse_options({**env["options"], "startingOffsets": "earliest"}))
    start, read = reader.initialOffset(), []

    def upload_more() -> None:
        builder.append(25)
        builder.upload()

    try:
        for trigger in range(12):
            upload_more()
            if trigger == 5:
                lose_watch_and_compact(reader, upload_more)
            end = reader.latestOffset(start, ReadAllAvailable())
            read.extend(offsets_read(reader.partitions(start, end)))
            reader.commit(end)
            start = end
        assert read == list(range(len(read))) and len(read) == 25 * 13
    finally:
        reader.stop()


def test_a_pattern_matching_nothing_yet_waits_and_reads_topics_as_they_appear(env, tmp_path, unique_name, s3_bucket,
                                                                               moto_s3):
    metadata = env["metadata"]
    prefix = unique_name("later")
    options = {k: v for k, v in env["options"].items() if k != "topic"}
    reader = DanubeStreamReader(parse_options({**options, "topicPattern": f"/default/{prefix}-.*",
                                               "startingOffsets": "earliest"}))
    builders = []
    try:
        start = reader.initialOffset()
        assert start["offsets"] == {}
        assert reader.latestOffset(start, ReadAllAvailable()) == start  # nothing yet: it waits
        store = ObjectStore(f"s3://{s3_bucket}", moto_s3.storage_options)
        for k in range(2):
            builders.append(TopicBuilder(metadata, store, str(tmp_path / "wal"), f"/default/{prefix}-{k}",
                                         root_prefix=env["options"]["rootPrefix"]))
            builders[-1].append(10 * (k + 1))
            builders[-1].upload()
        end = eventually(lambda: (e := reader.latestOffset(start, ReadAllAvailable()))["offsets"] and
                         len(e["offsets"]) == 2 and e, deadline_s=30)
        assert end["offsets"] == {f"/default/{prefix}-0": 10, f"/default/{prefix}-1": 20}
        assert sorted(offsets_read(reader.partitions(start, end))) == sorted([*range(10), *range(20)])
    finally:
        reader.stop()
        for builder in builders:
            builder.close()


def delete_topic(builder: TopicBuilder) -> None:
    """What the broker's DeleteTopic does to a topic (§6.7): index entry, storage keys, WAL."""
    builder.metadata.delete(namespace_topic_key(builder.topic))
    builder.metadata.delete_prefix(builder.storage_keys.topic_prefix(builder.topic))
    shutil.rmtree(os.path.dirname(builder.file_path(0)))


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_topic_deleted_while_a_stream_reads_it_is_named_and_its_unread_offsets_are_lost(env, fail_on_data_loss):
    builder, topic = env["builder"], env["topic"]
    builder.append(100)
    builder.upload()
    builder.append(50)
    reader = DanubeStreamReader(parse_options({**env["options"], "startingOffsets": "earliest",
                                               "failOnDataLoss": str(fail_on_data_loss).lower()}))
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadMaxRows(130))  # it knows of 150, reads 130
        assert offsets_read(reader.partitions(start, end)) == list(range(130))
        reader.commit(end)
        delete_topic(builder)
        cache_caught_up(reader, env["metadata"])
        if fail_on_data_loss:
            with pytest.raises(DataLossError, match=rf"{re.escape(topic)}.*deleted.*\[130, 150\)|"
                                                    rf"{re.escape(topic)}.*\[130, 150\).*deleted"):
                reader.latestOffset(end, ReadAllAvailable())
            return
        assert reader.latestOffset(end, ReadAllAvailable()) == end  # nothing more to read
        assert reader.reportLatestOffset()["skippedOffsets"] == {topic: 20}
        assert reader.latestOffset(end, ReadAllAvailable()) == end  # reported once, not again
        assert reader.reportLatestOffset()["skippedOffsets"] == {topic: 20}
    finally:
        reader.stop()


def test_cursor_commits_read_nothing_once_the_writer_knows_the_keys_and_recover_from_other_writers(env):
    """The listener's and the source's commits compare against the values they last saw: a
    steady run of commits sends etcd only the writes; another writer's change costs one failed
    compare and a fresh read, never a cursor moved back."""
    from connectors.cursor_commit import CursorWriter

    topic, subscription = env["topic"], env["options"]["subscription"]
    counted = CountingStore(EtcdMetadataStore(env["options"]["etcd.endpoints"]))
    try:
        writer = CursorWriter(counted, subscription)
        assert writer.commit({topic: 10}) == {topic: 9}
        reads = counted.reads
        for end in (20, 30, 40):
            assert writer.commit({topic: end}) == {topic: end - 1}
        assert counted.reads == reads
        env["metadata"].put(cursor_key(topic, subscription), dump_cursor(100))  # another writer
        assert writer.commit({topic: 50}) == {}  # behind etcd's cursor: not moved back
        assert env["metadata"].get(cursor_key(topic, subscription)) == dump_cursor(100)
        assert writer.commit({topic: 200}) == {topic: 199}
    finally:
        counted.close()


def test_a_named_topic_that_does_not_exist_is_named_listed_and_not_registered_until_it_exists(env, caplog):
    builder, metadata, topic = env["builder"], env["metadata"], env["topic"]
    builder.append(5)
    builder.upload()  # a topic of the namespace, listed in the warning
    missing = topic + "-nope"
    subscription = env["options"]["subscription"]
    reader = DanubeStreamReader(parse_options({**env["options"], "topic": missing, "startingOffsets": "earliest"}))
    late = None
    try:
        with caplog.at_level(logging.WARNING, logger="connectors.batch"):
            start = reader.initialOffset()
            end = reader.latestOffset(start, ReadAllAvailable())
        warnings = [r.getMessage() for r in caplog.records if r.name == "connectors.batch" and missing in r.getMessage()]
        assert len(warnings) == 1 and topic in warnings[0] and "failOnMissingTopic" in warnings[0], warnings
        assert reader.reportLatestOffset()["missingTopics"] == [missing]
        assert metadata.get_prefix(subscriptions_prefix(missing)) == []  # no record under a topic that is not
        late = TopicBuilder(metadata, ObjectStore(f"s3://{env['bucket']}", env["storage_options"]),
                            env["wal_root"], missing, root_prefix=env["options"]["rootPrefix"])
        late.append(7)
        late.upload()
        end = eventually(lambda: (e := reader.latestOffset(start, ReadAllAvailable()))["offsets"].get(missing) and e,
                         deadline_s=30)
        assert offsets_read(reader.partitions(start, end)) == list(range(7))
        assert "missingTopics" not in reader.reportLatestOffset()
        assert metadata.get(subscription_key(missing, subscription)) is not None
    finally:
        reader.stop()
        if late is not None:
            late.close()
    strict = DanubeStreamReader(parse_options({**env["options"], "topic": missing + "-too",
                                               "failOnMissingTopic": "true"}))
    try:
        with pytest.raises(ConfigError, match=rf"failOnMissingTopic.*{re.escape(missing)}-too does not exist.*{re.escape(topic)}"):
            strict.initialOffset()
    finally:
        strict.stop()


def test_a_stream_far_behind_plans_a_window_of_its_backlog_per_trigger(env, monkeypatch):
    """From `earliest` on a history longer than the planning window, each trigger plans and
    admits at most a window of objects (the rest in later batches), reports the whole backlog
    in messages, and its bytes up to the window's end, named."""
    window = 8
    monkeypatch.setattr(stream_module, "PLAN_WINDOW_OBJECTS", window)
    builder = env["builder"]
    for _ in range(30):
        builder.append(5)
        builder.upload()
    builder.append(3)  # a WAL tail past the last object
    total = 30 * 5 + 3
    topic = env["topic"]
    reader = DanubeStreamReader(parse_options({**env["options"], "startingOffsets": "earliest"}))
    start, read, batches = reader.initialOffset(), [], []
    try:
        while True:
            end = reader.latestOffset(start, ReadAllAvailable())
            if end == start:
                break
            progress = reader.reportLatestOffset()
            begin, stop = start["offsets"][topic], end["offsets"][topic]
            lag = progress["lag"][topic]
            assert lag["messages"] == total - begin  # the whole backlog, not the window
            if stop < total:
                assert lag["bytesUpTo"] == stop and lag["bytes"] > 0 and "ms" in lag
            else:
                assert "bytesUpTo" not in lag
            partitions = reader.partitions(start, end)
            batch = offsets_read(partitions)
            batches.append(len(batch))
            read.extend(batch)
            reader.commit(end)
            start = end
        assert read == list(range(total))
        assert max(batches) <= (window + 1) * 5 + 3 and len(batches) >= 30 // (window + 1)
    finally:
        reader.stop()


def cache_caught_up(reader: DanubeStreamReader, metadata: EtcdMetadataStore) -> None:
    """Wait until the stream's watch-synced cache has seen every etcd write made so far. The
    cache follows etcd's watch, which on a loaded machine can be a trigger behind a write made
    a moment ago: a test asserting what one trigger sees lets it catch up first."""
    state = reader._state
    assert state is not None
    state.scope.cache.wait_for_revision(metadata.current_revision(), 30)


# The new run: how far it got (offsets 0..new_run-1) and whether it uploaded them yet.
@pytest.mark.parametrize(("new_run", "new_run_uploaded"), [(70, True), (70, False), (30, False)])
@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_run_restarted_below_a_streams_position_is_named_once(env, fail_on_data_loss, new_run, new_run_uploaded):
    """A broker that restarts the topic at offset 0 while a stream is at 50 (the real broker's
    fault, spec §6.6): the new run's offsets below 50 are never read. The snapshot of the
    trigger that finds the new run says where it began; the stream names the loss once. Found
    from the new run's upload, or from the WAL file it appends to before it uploads (only the
    old run's descriptor in etcd), its head already past the stream's position or still below
    it (then the stream waits at 50, never going back, and reads on once the run passes it)."""
    builder, topic = env["builder"], env["topic"]
    builder.append(50)
    builder.upload()
    reader = DanubeStreamReader(parse_options({**env["options"], "startingOffsets": "earliest",
                                               "failOnDataLoss": str(fail_on_data_loss).lower()}))
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
        assert offsets_read(reader.partitions(start, end)) == list(range(50))
        reader.commit(end)
        builder.crash_restart(builder.broker_id + 1)
        builder.append(new_run)
        if new_run_uploaded:
            builder.upload()
        cache_caught_up(reader, env["metadata"])
        # The stream's view has caught up with etcd: this trigger finds the new run and names it.
        if fail_on_data_loss:
            with pytest.raises(DataLossError, match=rf"{re.escape(topic)}.*\[0, 50\).*restarted at 0"):
                reader.latestOffset(end, ReadAllAvailable())
            return
        after = reader.latestOffset(end, ReadAllAvailable())
        assert reader.reportLatestOffset()["skippedOffsets"] == {topic: 50}
        stop = new_run
        if new_run < 50:
            assert after == end  # nothing at or past the position yet, and never back below it
            stop = 75
            builder.append(stop - new_run)  # the run passes the position
            after = reader.latestOffset(end, ReadAllAvailable())
        assert after["offsets"] == {topic: stop}
        assert offsets_read(reader.partitions(end, after)) == list(range(50, stop))
        reader.commit(after)
        builder.append(5)
        builder.upload()
        reader.latestOffset(after, ReadAllAvailable())
        assert reader.reportLatestOffset()["skippedOffsets"] == {topic: 50}  # named once, not again
    finally:
        reader.stop()
