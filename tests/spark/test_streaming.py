"""Streaming reads: Trigger.AvailableNow into Delta, admission control, restarts, cursors, locks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from connectors.cursor_commit import commit_cursors, end_offsets_of
from danube_core import keys
from danube_core.records import load_json, parse_cursor
from tests.rig import eventually, query_reached
from tests.spark.test_batch_read import DanubeEnv, danube_env  # noqa: F401  (fixture)

pytestmark = pytest.mark.spark


def stream(spark, env: DanubeEnv, **options: str):
    return spark.readStream.format("danube").options(**env.options).options(**options).load()


def run_available_now(df, sink: str, path: Path, chk: Path):
    """Run to the end of what exists now; returns the finished query."""
    writer = df.writeStream.format(sink).option("checkpointLocation", str(chk)).trigger(availableNow=True)
    query = writer.start(str(path)) if sink == "delta" else writer.start()
    query.awaitTermination(300)
    assert query.exception() is None
    return query


def cursor(env: DanubeEnv, topic: str, subscription: str) -> int | None:
    key = keys.cursor_key(topic, subscription)
    raw = env.metadata.get(key)
    return None if raw is None else parse_cursor(raw, key)


def data_batches(query) -> list[dict]:
    """Progress of the batches that read something from the (single) source."""
    return [json.loads(p.json) for p in query.recentProgress if p.numInputRows > 0]


def offset_json(source_offset: str | dict | None) -> dict:
    """A source offset from progress JSON (already parsed there); the first batch has none."""
    if source_offset is None:
        return {"offsets": {}}
    return json.loads(source_offset) if isinstance(source_offset, str) else source_offset


def positions(source_offset: str | dict) -> dict[str, int]:
    return offset_json(source_offset)["offsets"]


def test_available_now_into_delta_commits_cursor(spark, danube_env: DanubeEnv, unique_name, tmp_path) -> None:
    name, sub = f"/default/{unique_name('orders')}", unique_name("sub")
    b = danube_env.topic(name)
    b.append(1000)
    b.upload()
    b.append(500)  # 1000..1499 in the WAL only

    df = stream(spark, danube_env, topic=name, subscription=sub, startingOffsets="earliest", maxMessagesPerTrigger="600")
    query = run_available_now(df, "delta", tmp_path / "table", tmp_path / "chk")

    table = spark.read.format("delta").load(str(tmp_path / "table"))
    rows = table.select("offset", "payload").orderBy("offset").collect()
    assert [r["offset"] for r in rows] == list(range(1500))
    assert all(bytes(r["payload"]) == b.messages[r["offset"]].payload for r in rows)
    batches = data_batches(query)
    assert len(batches) == 3 and all(p["numInputRows"] <= 600 for p in batches)

    last_in_table = table.agg({"offset": "max"}).collect()[0][0]
    eventually(lambda: cursor(danube_env, name, sub) == last_in_table, 30)

    source = batches[-1]["sources"][0]
    latest, start = offset_json(source["latestOffset"]), positions(source["startOffset"])[name]
    frame_size = {f.offset: f.size for f in b.gen.frames}
    assert latest["offsets"] == {name: 1500}
    # Lag before the last batch; its start is in the WAL, so bytes are exact; publish_time = base + offset.
    assert latest["lag"][name] == {
        "messages": 1500 - start, "bytes": sum(frame_size[o] for o in range(start, 1500)), "ms": 1500 - start,
    }
    record = load_json(danube_env.metadata.get(keys.subscription_key(name, sub)), "record")
    assert record["subscription_name"] == sub and "lag" in record


def test_max_bytes_per_trigger_bounds_every_batch(spark, danube_env: DanubeEnv, unique_name, tmp_path) -> None:
    name, sub = f"/default/{unique_name('bytes')}", unique_name("sub")
    b = danube_env.topic(name)
    b.append(150)
    b.upload()
    b.append(60)
    frame_size = {f.offset: f.size for f in b.gen.frames}
    limit = 6 * 1024

    df = stream(spark, danube_env, topic=name, subscription=sub, startingOffsets="earliest", maxBytesPerTrigger="6k")
    query = run_available_now(df, "noop", tmp_path, tmp_path / "chk")

    batches = data_batches(query)
    assert len(batches) >= 4
    read = []
    for progress in batches:
        source = progress["sources"][0]
        start, end = positions(source["startOffset"]).get(name, 0), positions(source["endOffset"])[name]
        assert sum(frame_size[o] for o in range(start, end)) <= limit
        read.extend(range(start, end))
    assert read == list(range(210))


def test_restart_from_checkpoint_reads_everything_once(spark, danube_env: DanubeEnv, unique_name, tmp_path) -> None:
    prefix, sub = unique_name("restart"), unique_name("sub")
    first = danube_env.topic(f"/default/{prefix}-a")
    first.append(600)
    table, chk = tmp_path / "table", tmp_path / "chk"
    options = dict(topicPattern=f"/default/{prefix}-.*", subscription=sub, startingOffsets="earliest")

    query = (stream(spark, danube_env, maxMessagesPerTrigger="100", **options).writeStream.format("delta")
             .option("checkpointLocation", str(chk)).start(str(table)))
    eventually(lambda: query_reached(query, 1), 120)
    query.stop()

    first.append(200)
    later = [danube_env.topic(f"/default/{prefix}-b-part-{k}") for k in range(2)]  # created after the stop
    for part in later:
        part.append(30)
    run_available_now(stream(spark, danube_env, **options), "delta", table, chk)

    rows = spark.read.format("delta").load(str(table)).select("topic", "partition", "offset").collect()
    got = sorted((r["topic"], r["partition"], r["offset"]) for r in rows)
    want = sorted([(first.name, None, o) for o in range(800)] +
                  [(f"/default/{prefix}-b", k, o) for k in range(2) for o in range(30)])
    assert got == want  # every message exactly once
    eventually(lambda: cursor(danube_env, first.name, sub) == 799, 30)
    assert all(eventually(lambda p=p: cursor(danube_env, p.name, sub) == 29, 30) for p in later)


def test_starting_offsets_cursor_resumes_after_cursor(spark, danube_env: DanubeEnv, unique_name, tmp_path) -> None:
    name, sub = f"/default/{unique_name('cur')}", unique_name("sub")
    b = danube_env.topic(name)
    b.append(150)
    danube_env.metadata.put(keys.cursor_key(name, sub), b"99")

    query_name = unique_name("q").replace("-", "_")
    df = stream(spark, danube_env, topic=name, subscription=sub, startingOffsets="cursor")
    writer = df.writeStream.format("memory").queryName(query_name).option("checkpointLocation", str(tmp_path / "chk"))
    writer.trigger(availableNow=True).start().awaitTermination(300)

    offsets = [r["offset"] for r in spark.table(query_name).orderBy("offset").collect()]
    assert offsets == list(range(100, 150))


def test_foreach_batch_writer_commits_right_after_its_write(spark, danube_env: DanubeEnv, unique_name, tmp_path) -> None:
    name, sub = f"/default/{unique_name('fb')}", unique_name("sub")
    danube_env.topic(name).append(90)
    options = dict(danube_env.options, topic=name, subscription=sub, startingOffsets="earliest")
    seen: list[tuple[int | None, int]] = []

    def write(batch, batch_id: int) -> None:
        batch.write.format("delta").mode("append").save(str(tmp_path / "table"))
        commit_cursors(options, end_offsets_of(batch))
        seen.append((cursor(danube_env, name, sub), batch.agg({"offset": "max"}).collect()[0][0]))

    df = spark.readStream.format("danube").options(**options).option("maxMessagesPerTrigger", "40").load()
    df.writeStream.foreachBatch(write).option("checkpointLocation", str(tmp_path / "chk")) \
        .trigger(availableNow=True).start().awaitTermination(300)
    assert [s for s in seen if s[1] is not None] == [(39, 39), (79, 79), (89, 89)]


def test_second_live_query_on_a_subscription_is_refused(spark, danube_env: DanubeEnv, unique_name, tmp_path) -> None:
    name, sub = f"/default/{unique_name('lock')}", unique_name("sub")
    danube_env.topic(name).append(5)
    first = (stream(spark, danube_env, topic=name, subscription=sub).writeStream.format("noop")
             .option("checkpointLocation", str(tmp_path / "chk1")).trigger(processingTime="1 second").start())
    try:
        eventually(lambda: query_reached(first), 120)
        second = (stream(spark, danube_env, topic=name, subscription=sub).writeStream.format("noop")
                  .option("checkpointLocation", str(tmp_path / "chk2")).start())
        with pytest.raises(Exception, match="already consumed by a live query"):
            second.awaitTermination(120)
        assert first.isActive
    finally:
        first.stop()


def test_a_query_that_lost_its_lock_stops_and_leaves_the_new_owners_cursor(spark, danube_env: DanubeEnv, unique_name,
                                                                            tmp_path) -> None:
    """The lock's etcd lease revoked mid-query and the subscription taken over by another
    owner: the query stops with an error naming the subscription, and the batch it read after
    the loss moves no cursor (the new owner's stays where it was)."""
    import pyetcd

    from connectors.subscription_lock import SubscriptionLock

    name, sub = f"/default/{unique_name('lease')}", unique_name("sub")
    topic = danube_env.topic(name)
    topic.append(5)
    query = (stream(spark, danube_env, topic=name, subscription=sub).writeStream.format("noop")
             .option("checkpointLocation", str(tmp_path / "chk")).trigger(processingTime="500 milliseconds").start())
    other = None
    try:
        eventually(lambda: cursor(danube_env, name, sub) == 4, 120)
        lock_key = keys.subscription_lock_key("/danube-data", sub)
        lease = load_json(danube_env.metadata.get(lock_key), lock_key)["lease"]
        host, port = danube_env.options["etcd.endpoints"].rsplit(":", 1)
        client = pyetcd.client(host=host, port=int(port))
        try:
            client.revoke_lease(int(lease, 16))
        finally:
            client.close()
        other = SubscriptionLock(danube_env.metadata, "/danube-data", sub)  # another query takes over
        topic.append(5)  # the stopped owner's next batch would move the cursor to 9
        with pytest.raises(Exception, match=f"subscription '{sub}': lost the subscription lock"):
            query.awaitTermination(120)
        assert cursor(danube_env, name, sub) == 4
    finally:
        query.stop()
        if other is not None:
            other.release()


def test_offsets_skipped_on_executors_are_counted_in_query_progress(spark, danube_env: DanubeEnv, unique_name,
                                                                    tmp_path) -> None:
    """An object deleted under the stream (after etcd described it): the executor reading it
    skips its offsets (failOnDataLoss=false) and records them under lostOffsetsLocation; the
    driver counts them in `skippedOffsets` of the next batch's progress and deletes the record."""
    name, sub = f"/default/{unique_name('lossy')}", unique_name("sub")
    topic = danube_env.topic(name)
    topic.append(10)
    topic.upload()
    topic.append(7)
    doomed = topic.upload()  # offsets 10..16
    assert doomed is not None
    danube_env.store.delete(topic.object_url(doomed))
    lost_dir = tmp_path / "lost"
    query = (stream(spark, danube_env, topic=name, subscription=sub, startingOffsets="earliest",
                    failOnDataLoss="false", lostOffsetsLocation=str(lost_dir))
             .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "chk"))
             .trigger(processingTime="500 milliseconds").start())
    try:
        eventually(lambda: sum(p.numInputRows for p in query.recentProgress) == 10, 120)
        assert not any("skippedOffsets" in offset_json(p.sources[0].latestOffset) for p in query.recentProgress)
        topic.append(3)
        topic.upload()  # a next batch, whose progress reports what the last one skipped

        def reported() -> dict | None:
            for progress in query.recentProgress:
                skipped = offset_json(progress.sources[0].latestOffset).get("skippedOffsets")
                if skipped:
                    return skipped
            return None

        assert eventually(reported, 120) == {name: 7}
        assert eventually(lambda: sum(p.numInputRows for p in query.recentProgress) == 13, 120)
        assert not list(lost_dir.glob("*.json"))  # folded once, then deleted
        assert query.exception() is None
    finally:
        query.stop()


def test_a_users_schema_reads_only_its_columns_in_batches_and_streams(spark, danube_env: DanubeEnv, unique_name,
                                                                     tmp_path) -> None:
    """`.schema(...)` naming some of the source's columns: exactly those, in its order, from
    the objects and the WAL (only they are decoded); a column the source has not is refused at
    `load()` naming it."""
    name, sub = f"/default/{unique_name('narrow')}", unique_name("sub")
    b = danube_env.topic(name)
    b.append(30)
    obj = b.upload()
    b.append(10)
    wanted = "source string, payload binary, offset bigint"
    want = [(obj.object_id if o < 30 else "wal", b.messages[o].payload, o) for o in range(40)]

    df = spark.read.format("danube").options(**danube_env.options).schema(wanted).load(topic=name, includeSource="true")
    assert df.columns == ["source", "payload", "offset"]
    assert sorted((r["source"], bytes(r["payload"]), r["offset"]) for r in df.collect()) == sorted(want)

    query_name = unique_name("q").replace("-", "_")
    streamed = (spark.readStream.format("danube").options(**danube_env.options).schema(wanted)
                .load(topic=name, subscription=sub, startingOffsets="earliest", includeSource="true"))
    query = (streamed.writeStream.format("memory").queryName(query_name)
             .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start())
    query.awaitTermination(300)
    assert query.exception() is None
    rows = spark.table(query_name).collect()
    assert spark.table(query_name).columns == ["source", "payload", "offset"]
    assert sorted((r["source"], bytes(r["payload"]), r["offset"]) for r in rows) == sorted(want)

    with pytest.raises(Exception) as refused:
        spark.read.format("danube").options(**danube_env.options).schema("offset bigint, key string") \
            .load(topic=name).collect()
    assert "ConfigError: schema: column 'key' is not one of the danube source's" in str(refused.value).splitlines()[0]
