"""Pure parts of the exactly-once checks: commit trails, the checkpoint check, split decisions,
offsets-log parsing and the skipped-offset count (no Spark session, no servers)."""

from __future__ import annotations

import json

import pytest

from danube_core.errors import CheckpointMismatchError
from pipelines.batch_trail import SplitDecision, TableTrail, check_checkpoint, latest_trail, resume_positions
from pipelines.checkpoint_state import (
    CheckpointState, PlannedRange, missing_offsets, parse_query_id, parse_source_offset, ranges_between,
)
from pipelines.config import DecodeConfig, ExpectationRule

pytestmark = pytest.mark.unit

DECISION = SplitDecision(DecodeConfig("json", subject="orders"), 7, 2, "orders",
                         (ExpectationRule("expect_column_values_to_be_between", {"column": "amount", "min_value": 0}),))


def meta(batch: int, pipeline: str = "p", checkpoint: str | None = "ck-1", **extra) -> str:
    return json.dumps({"pipeline": pipeline, "batch_id": batch, "checkpoint": {"id": checkpoint, "location": "/ck"},
                       "offsets": {"/ns/t": {"start": 0, "end": 10 * (batch + 1)}}, **extra})


def trail(batch: int, checkpoint: str | None = "ck-1") -> TableTrail:
    return TableTrail("/lake/target", batch, checkpoint, "/ck", None, {"/ns/t": {"start": 0, "end": 10 * (batch + 1)}})


def test_latest_trail_is_the_newest_commit_of_the_pipeline():
    commits = [(0, meta(0)), (1, None), (2, meta(5, pipeline="other")), (3, meta(1, split=DECISION.to_json_dict())),
               (4, "not json")]
    found = latest_trail("/lake/target", commits, "p")
    assert (found.last_batch, found.checkpoint_id, found.decision) == (1, "ck-1", DECISION)
    assert latest_trail("/lake/target", [(0, None), (1, meta(0, pipeline="other"))], "p") is None


def test_split_decision_round_trips_through_json_with_a_stable_fingerprint():
    text = json.dumps(DECISION.to_json_dict())
    again = SplitDecision.from_json_dict(json.loads(text))
    assert again == DECISION and again.fingerprint == DECISION.fingerprint
    assert again.expectations().rules == DECISION.rules
    assert SplitDecision(DecodeConfig()).expectations() is None


@pytest.mark.parametrize(
    "checkpoint, batch_id, trails, expected",
    [
        (CheckpointState("/ck", "ck-1", 3), None, [trail(3)], None),  # replay of batch 3 after a crash
        (CheckpointState("/ck", "ck-1", 4), None, [trail(3)], None),
        (CheckpointState("/ck", None, None), None, [], None),  # a new pipeline
        (CheckpointState("/ck", None, None), None, [trail(0)], "holds batches up to 0"),  # deleted
        (CheckpointState("/ck", "ck-1", 1), None, [trail(3)], "holds batches up to 3"),  # old copy restored
        (CheckpointState("/ck", "ck-2", 9), None, [trail(3)], "under checkpoint id ck-1"),  # another query's
        (CheckpointState("/ck", "ck-2", None), 0, [trail(0)], "under checkpoint id ck-1"),  # the sink, batch 0
        (CheckpointState("/ck", "ck-1", 2), 2, [trail(3)], "about to write batch 2"),
        (CheckpointState("/ck", "ck-2", 5), None, [trail(3, checkpoint=None)], None),  # written before ids
    ],
)
def test_check_checkpoint(checkpoint, batch_id, trails, expected):
    if expected is None:
        check_checkpoint("p", checkpoint, trails, batch_id)
        return
    with pytest.raises(CheckpointMismatchError) as refused:
        check_checkpoint("p", checkpoint, trails, batch_id)
    message = str(refused.value)
    assert expected in message
    for part in ("/lake/target", "txnAppId 'p'", "/ck", "restore", "new name", "starting_offsets"):
        assert part in message


def test_resume_positions_come_from_the_newest_batch():
    assert resume_positions([trail(3), trail(2)]) == {"/ns/t": 40}
    assert resume_positions([]) == {}


def test_offset_log_entries_and_query_ids():
    entry = 'v1\n{"batchWatermarkMs":0}\n{"offsets":{"/ns/t":12},"subscription":"s"}'
    offset = parse_source_offset(entry)
    assert offset is not None and dict(offset.positions) == {"/ns/t": 12}
    assert parse_source_offset('v1\n{}\n-') is None and parse_source_offset(None) is None
    assert parse_query_id('{"id":"abc"}\n') == "abc"
    assert parse_query_id(None) is None and parse_query_id("garbage") is None


def test_missing_offsets_inside_the_planned_ranges():
    planned = ranges_between({"/ns/a": 10, "/ns/b": 0}, {"/ns/a": 20, "/ns/b": 5, "/ns/new": 8})
    assert planned["/ns/new"] == PlannedRange(None, 8)
    rows = {"/ns/a": (10, 7), "/ns/new": (3, 5)}  # a: 3 skipped; b: all 5 skipped; new: counted from its first row
    assert missing_offsets(planned, rows) == {"/ns/a": 3, "/ns/b": 5}
    assert missing_offsets({"/ns/x": PlannedRange(None, 4)}, {}) == {}
