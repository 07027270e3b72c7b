"""The tail's rows are the pipeline's rows: `TailFeed` reads a topic past a point and splits it with
the pipeline's own decoder and suite, and gives exactly the rows the pipeline writes to its
Delta target (values included), none of the quarantined ones; lost offsets are a loss, not a skip.
Topics in the broker's layout (`tests.topic_builder`), the session's Spark."""

from __future__ import annotations

import pytest

from danube_core.errors import DataLossError
from pipelines.tail_feed import TailFeed
from tests.spark.test_pipeline_decode import BROKEN, lake, payload  # noqa: F401 (fixture)

pytestmark = pytest.mark.spark

COLUMNS = ["_topic", "_offset", "order_id", "amount", "currency", "_rescued_data"]


def test_tail_rows_are_exactly_the_target_rows_the_pipeline_writes(lake):  # noqa: F811
    subject, _ = lake.subject()
    topic = lake.topic(f"/default/{lake.unique_name('tail')}")
    topic.append(12, payload=payload)
    topic.upload()
    topic.append(8, payload=payload)  # offsets 12..19 only in the WAL
    config = lake.config([topic.name], decode={"format": "json", "subject": subject})
    feed = TailFeed(config, spark=lake.spark)
    try:
        assert feed.topics() == [topic.name]
        assert feed.latest([topic.name]) == {topic.name: 20}
        batch = feed.read({topic.name: 2}, {topic.name: 20})
    finally:
        feed.close()
    lake.run(config)
    expected = sorted(tuple(r[c] for c in COLUMNS) for r in lake.rows(config.target.path) if r["_offset"] >= 2)
    got = sorted(tuple(r[c] for c in COLUMNS) for r in batch.rows.to_pylist())
    assert got == expected and len(got) == 18 - len([o for o in BROKEN if o >= 2])
    assert (dict(batch.first), dict(batch.ends), batch.read) == ({topic.name: 2}, {topic.name: 20}, 18)
    assert batch.quarantined == len(BROKEN)


def test_offsets_the_topic_no_longer_has_are_a_loss_whatever_the_pipeline_says(lake):  # noqa: F811
    topic = lake.topic(f"/default/{lake.unique_name('lost')}")
    topic.append(10)
    topic.upload()
    topic.append(5)
    topic.store.delete(topic.object_url(topic.descriptors[0]))  # offsets 0..9 are gone
    config = lake.config([topic.name], decode={"format": "raw"}, rules=None, fail_on_data_loss=False)
    feed = TailFeed(config, spark=lake.spark)
    try:
        with pytest.raises(DataLossError, match="does not exist"):
            feed.read({topic.name: 0}, {topic.name: 15})
    finally:
        feed.close()
