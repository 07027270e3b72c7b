"""`format("danube")` in Spark on topics the REAL Danube v0.7.3 broker wrote (`../shared/golden`).

As a new user would try it: a batch read and a Trigger.AvailableNow stream into Delta of every
scenario, compared message by message with the client's manifest (offset, payload sha256,
attributes, producer, publish time, schema ids); the defaults on a topic whose WAL tail a
real broker never advertises; and `moved`, where the real broker reused offsets 0..599: a
loud failure by default, the current run only with failOnDataLoss=false (skipped offsets in
query progress), and the old owner's messages landed in Delta by a salvage read.
"""

from __future__ import annotations

import json

import pytest

from tests.golden import (
    MOVED_OLD_OWNER_SUBSCRIPTION, MOVED_ORPHAN, MOVED_STALE_DESCRIPTOR_OBJECT, SCENARIOS, expected, received,
)

pytestmark = pytest.mark.spark

COLUMNS = ("topic", "partition", "offset", "sha2(payload, 256) AS payload_sha256", "attributes",
           "producer_name", "unix_millis(publish_time) AS publish_time", "CAST(schema_id AS LONG) AS schema_id",
           "schema_version")


def messages(df) -> tuple[dict, int]:
    """({(broker topic, offset): manifest-shaped message}, row count) of a danube-shaped frame."""
    found, rows = {}, 0
    for r in df.selectExpr(*COLUMNS).collect():
        topic = r["topic"] if r["partition"] is None else f"{r['topic']}-part-{r['partition']}"
        found[(topic, r["offset"])] = (r["offset"], r["payload_sha256"], tuple(sorted(r["attributes"].items())),
                                       r["producer_name"], r["publish_time"], r["schema_id"], r["schema_version"])
        rows += 1
    return found, rows


def run_available_now(df, path, chk):
    """Start an AvailableNow query into Delta and wait for it; its failure stays in `exception()`."""
    from pyspark.errors import StreamingQueryException

    query = (df.writeStream.format("delta").option("checkpointLocation", str(chk))
             .trigger(availableNow=True).start(str(path)))
    try:
        query.awaitTermination(300)
    except StreamingQueryException:
        pass
    return query


@pytest.mark.parametrize("name", SCENARIOS)
def test_batch_with_wal_root_returns_exactly_the_current_run(spark, golden, name):
    scenario = golden(name)
    df = (spark.read.format("danube").options(**scenario.options(walRoot=scenario.wal_map()))
          .option("failOnDataLoss", str(name != "moved").lower()).load())
    found, rows = messages(df)
    assert found == expected(name) and rows == len(found)


@pytest.mark.parametrize("name", SCENARIOS)
def test_stream_available_now_into_delta_lands_the_current_run_once(spark, golden, name, tmp_path):
    scenario = golden(name)
    df = (spark.readStream.format("danube")
          .options(**scenario.options(walRoot=scenario.wal_map(), subscription="to-delta",
                                      startingOffsets="earliest", maxMessagesPerTrigger="700"))
          .option("failOnDataLoss", str(name != "moved").lower()).load())
    query = run_available_now(df, tmp_path / "table", tmp_path / "chk")
    assert query.exception() is None
    found, rows = messages(spark.read.format("delta").load(str(tmp_path / "table")))
    assert found == expected(name) and rows == len(found)
    if name == "moved":
        progress = [json.loads(p.json) for p in query.recentProgress]
        skipped = [json.loads(p["sources"][0]["latestOffset"]).get("skippedOffsets") if isinstance(
            p["sources"][0]["latestOffset"], str) else p["sources"][0]["latestOffset"].get("skippedOffsets")
            for p in progress if p["sources"][0]["latestOffset"]]
        assert {"/default/moved": 600} in skipped


def test_defaults_stream_reports_the_tail_it_cannot_reach(spark, golden, tmp_path):
    scenario = golden("normal")
    df = (spark.readStream.format("danube")
          .options(**scenario.options(subscription="defaults", startingOffsets="earliest")).load())
    query = run_available_now(df, tmp_path / "table", tmp_path / "chk")
    assert query.exception() is None
    found, _ = messages(spark.read.format("delta").load(str(tmp_path / "table")))
    assert found == {k: v for k, v in expected("normal").items() if k[1] < 1600}
    latest = query.lastProgress["sources"][0]["latestOffset"]
    latest = json.loads(latest) if isinstance(latest, str) else latest
    tail = latest["unreadTail"]["/default/normal"]
    assert (tail["fromOffset"], tail["atLeastThrough"]) == (1600, 1600)
    assert "wal_url" in tail["reason"]


def test_moved_with_defaults_fails_naming_topic_reused_offsets_and_orphan(spark, golden, tmp_path):
    scenario = golden("moved")
    with pytest.raises(Exception) as batch_failure:
        spark.read.format("danube").options(**scenario.options()).load().collect()
    df = (spark.readStream.format("danube")
          .options(**scenario.options(subscription="strict", startingOffsets="earliest")).load())
    query = run_available_now(df, tmp_path / "table", tmp_path / "chk")
    for message in (str(batch_failure.value), str(query.exception())):
        for part in ("DataLossError", "/default/moved", "[0, 600)", MOVED_ORPHAN):
            assert part in message
    assert not (tmp_path / "table" / "_delta_log").exists() or spark.read.format("delta").load(
        str(tmp_path / "table")).count() == 0


def test_salvage_lands_the_old_owners_messages_in_delta_with_provenance(spark, golden, tmp_path):
    scenario = golden("moved")
    (spark.read.format("danube")
     .options(**scenario.options(salvage=f"{MOVED_ORPHAN},{MOVED_STALE_DESCRIPTOR_OBJECT}")).load()
     .write.format("delta").save(str(tmp_path / "salvaged")))
    table = spark.read.format("delta").load(str(tmp_path / "salvaged"))
    found, rows = messages(table)
    assert found == received("moved", MOVED_OLD_OWNER_SUBSCRIPTION) and rows == 800
    by_source = {r["source"]: (r["lo"], r["hi"]) for r in
                 table.groupBy("source").agg({"offset": "min"}).withColumnRenamed("min(offset)", "lo")
                 .join(table.groupBy("source").agg({"offset": "max"}).withColumnRenamed("max(offset)", "hi"),
                       "source").collect()}
    assert by_source == {MOVED_ORPHAN: (0, 599), MOVED_STALE_DESCRIPTOR_OBJECT: (600, 799)}
