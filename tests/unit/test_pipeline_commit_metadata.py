"""What a pipeline records in each Delta commit for people and the console (no Spark): rows in,
written and quarantined by reason, and the batch's start time; older readers' fields unchanged."""

from __future__ import annotations

import json

import pytest

from pipelines.batch_summary import DECODE_REASON, BatchSummary
from pipelines.batch_trail import commit_trail
from pipelines.delta_sink import commit_metadata
from pipelines.expectations import BatchQuality
from pipelines.metrics import OffsetSpan

pytestmark = pytest.mark.unit

SPANS = {"/default/orders-part-0": OffsetSpan(0, 6, 6, ("obj-0",)), "/default/orders-part-1": OffsetSpan(3, 7, 4, ())}
BETWEEN, NOT_NULL = "expect_column_values_to_be_between(amount)", "expect_column_values_to_not_be_null(order_id)"


def quality(failed: dict) -> BatchQuality:
    return BatchQuality("orders", not failed, (), failed, 0.1)


def test_quarantine_reasons_are_the_decode_failures_and_each_rows_failed_expectations():
    summary = BatchSummary(SPANS, decode_failures=2)
    checked = quality({("/default/orders-part-0", 1): (BETWEEN,), ("/default/orders-part-0", 2): (BETWEEN, NOT_NULL),
                       ("/default/orders-part-1", 4): (BETWEEN,)})
    reasons = summary.quarantine_reasons(checked)
    assert reasons == {DECODE_REASON: 2, BETWEEN: 2, f"{BETWEEN} & {NOT_NULL}": 1}
    assert sum(reasons.values()) == summary.counts(checked)["decode"] + summary.counts(checked)["expectations"]
    assert BatchSummary(SPANS, decode_failures=0).quarantine_reasons(None) == {}


def test_commit_metadata_carries_counts_by_reason_and_the_start_time():
    summary = BatchSummary(SPANS, decode_failures=1)
    checked = quality({("/default/orders-part-1", 4): (BETWEEN,)})
    meta = json.loads(commit_metadata("orders", 3, SPANS, counts=summary.counts(checked),
                                      reasons=summary.quarantine_reasons(checked), started_ms=1_700_000_000_123))
    assert meta["counts"] == {"rows": 10, "target": 8, "quarantine": 2,
                              "quarantine_by_reason": {DECODE_REASON: 1, BETWEEN: 1}}
    assert meta["started_ms"] == 1_700_000_000_123
    assert meta["offsets"]["/default/orders-part-1"] == {"start": 3, "end": 7}
    trail = commit_trail("/lake/orders", json.dumps(meta), "orders")  # what replays read is unchanged
    assert trail is not None and trail.last_batch == 3

    plain = json.loads(commit_metadata("orders", 3, SPANS, counts=summary.counts(checked)))
    assert "started_ms" not in plain and "quarantine_by_reason" not in plain["counts"]
