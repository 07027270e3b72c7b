"""Cursors stay current in a query that has no cursor-committing listener.

A query whose source Spark found on its own (no `connectors.register(spark)`, as in Declarative
Pipelines) has only the source itself to commit cursors. These run with the session's listener
removed; tests/spark/test_streaming.py covers the same with it.
"""

from __future__ import annotations

from typing import Iterator

import pytest

import connectors
from tests.rig import eventually
from tests.spark.test_batch_read import DanubeEnv, danube_env  # noqa: F401  (fixture)
from tests.spark.test_streaming import cursor, run_available_now, stream

pytestmark = pytest.mark.spark


@pytest.fixture
def without_listener(spark) -> Iterator[None]:
    committer = connectors.register(spark)
    spark.streams.removeListener(committer)
    try:
        yield
    finally:
        spark.streams.addListener(committer)


def test_available_now_commits_its_last_batch_without_listener(spark, danube_env: DanubeEnv, unique_name,
                                                               tmp_path, without_listener) -> None:
    # regression: the cursor stayed one batch behind (Spark never passes the last batch to commit())
    name, sub = f"/default/{unique_name('nolistener')}", unique_name("sub")
    b = danube_env.topic(name)
    b.append(500)
    b.upload()
    b.append(200)

    df = stream(spark, danube_env, topic=name, subscription=sub, startingOffsets="earliest",
                maxMessagesPerTrigger="300")
    query = run_available_now(df, "delta", tmp_path / "table", tmp_path / "chk")

    assert len([p for p in query.recentProgress if p.numInputRows > 0]) == 3
    assert spark.read.format("delta").load(str(tmp_path / "table")).count() == 700
    # The query has terminated: nothing is left to commit later, so it must be there now.
    assert cursor(danube_env, name, sub) == 699


def test_running_stream_commits_each_batch_without_listener(spark, danube_env: DanubeEnv, unique_name,
                                                            tmp_path, without_listener) -> None:
    name, sub = f"/default/{unique_name('nolistener')}", unique_name("sub")
    b = danube_env.topic(name)
    b.append(40)
    query = (stream(spark, danube_env, topic=name, subscription=sub, startingOffsets="earliest")
             .writeStream.format("delta").option("checkpointLocation", str(tmp_path / "chk"))
             .start(str(tmp_path / "table")))
    try:
        query.processAllAvailable()
        eventually(lambda: cursor(danube_env, name, sub) == 39, 60)
        b.append(25)  # one more batch, and no batch after it
        query.processAllAvailable()
        eventually(lambda: cursor(danube_env, name, sub) == 64, 60)
        assert query.exception() is None
    finally:
        query.stop()
    assert spark.read.format("delta").load(str(tmp_path / "table")).count() == 65
