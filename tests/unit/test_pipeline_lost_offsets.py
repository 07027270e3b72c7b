"""A pipeline with failOnDataLoss=false has its executors record skipped offsets under its
checkpoint (connectors.loss_records), where fsspec can reach it."""

from __future__ import annotations

import pytest

from pipelines.config import load_config
from pipelines.runner import lost_offsets_option
from tests.unit.test_pipeline_config import with_changes, write

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("checkpoint, expected", [
    ("/lake/_checkpoints/orders", "/lake/_checkpoints/orders/danube-lost-offsets"),
    ("s3://bucket/chk/", "s3://bucket/chk/danube-lost-offsets"),
    ("dbfs:/chk", "/dbfs/chk/danube-lost-offsets"),
    ("viewfs://cluster/chk", None),  # Hadoop-only: executor losses are then logged, not in progress
])
def test_lost_offsets_location_under_the_checkpoint(tmp_path, checkpoint, expected) -> None:
    data = with_changes(None, checkpoint=checkpoint)
    data["source"]["fail_on_data_loss"] = False
    option = lost_offsets_option(load_config(write(tmp_path, data), env={}))
    assert option.get("lostOffsetsLocation") == expected


def test_no_location_when_losses_fail_the_pipeline(tmp_path) -> None:
    assert lost_offsets_option(load_config(write(tmp_path, with_changes(None)), env={})) == {}
