"""The one data-loss function: fail naming topic, range and object, or warn and count."""

from __future__ import annotations

import logging

import pytest

from connectors.data_loss import LostRange, report, total_lost
from danube_core.errors import CorruptFrameError, DataLossError


def test_fail_on_data_loss_raises_naming_topic_range_and_object():
    cause = CorruptFrameError("s3://b/data-0-1.dnb1", 7, 95, "CRC mismatch")
    with pytest.raises(DataLossError) as err:
        report("/ns/t", 7, 20, "CRC mismatch", fail_on_data_loss=True, source="data-0-1.dnb1", cause=cause)
    message = str(err.value)
    assert "/ns/t" in message and "[7, 20)" in message and "data-0-1.dnb1" in message
    assert "failOnDataLoss=false" in message
    assert err.value.__cause__ is cause
    assert not err.value.retriable


def test_without_fail_it_warns_and_returns_what_was_lost(caplog):
    with caplog.at_level(logging.WARNING, logger="connectors.data_loss"):
        lost = report("/ns/t", 100, 121, "WAL pruned", fail_on_data_loss=False, source="wal")
    assert lost == LostRange("/ns/t", 100, 121, "WAL pruned", "wal")
    assert lost.count == 21
    assert "[100, 121)" in caplog.text and "/ns/t" in caplog.text


def test_counts_per_topic():
    ranges = [LostRange("/a/x", 0, 5, "r"), LostRange("/a/y", 3, 4, "r"), LostRange("/a/x", 9, 10, "r"),
              LostRange("/a/z", 9, 3, "inverted")]
    assert total_lost(ranges) == {"/a/x": 6, "/a/y": 1, "/a/z": 0}
