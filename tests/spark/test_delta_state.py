"""The sink's Delta state warm-up: the next idempotent write finds the table's state computed.

Counted in Spark jobs, not time: an idempotent append (`txnAppId`/`txnVersion`) to a table
whose newest snapshot has no computed state runs Delta's state-reconstruction jobs first; after
`TableStateWarmer` has run, the same append runs only its own write job.
"""

from __future__ import annotations

import pytest

from pipelines.config import TableConfig
from pipelines.delta_state import TableStateWarmer

pytestmark = pytest.mark.spark


def _jobs_of(spark, group: str, action) -> int:
    context = spark.sparkContext
    context.setJobGroup(group, group)
    try:
        action()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    return len(context.statusTracker().getJobIdsForGroup(group))


def _append(spark, path: str, version: int) -> None:
    (spark.range(10).write.format("delta").mode("append")
     .option("txnAppId", "warm-test").option("txnVersion", str(version)).save(path))


def test_an_idempotent_write_after_the_warm_up_runs_only_its_own_job(spark, tmp_path, unique_name):
    path = str(tmp_path / "table")
    _append(spark, path, 0)
    cold = _jobs_of(spark, unique_name("cold"), lambda: _append(spark, path, 1))
    warmer = TableStateWarmer()
    warmer.warm(spark, TableConfig(path=path))
    warmer.wait()
    warm = _jobs_of(spark, unique_name("warm"), lambda: _append(spark, path, 2))
    assert warm == 1, f"the write after the warm-up ran {warm} jobs"
    assert cold > warm, f"without the warm-up the write ran {cold} jobs: the test no longer shows a difference"
    assert spark.read.format("delta").load(path).count() == 30


def test_a_failed_warm_up_is_ignored_and_the_warmer_keeps_working(spark, tmp_path):
    warmer = TableStateWarmer()
    warmer.warm(spark, TableConfig(path=str(tmp_path / "not-a-table")))
    warmer.wait()
    path = str(tmp_path / "table")
    _append(spark, path, 0)
    warmer.warm(spark, TableConfig(path=path))
    warmer.wait()
    _append(spark, path, 1)
    assert spark.read.format("delta").load(path).count() == 20
