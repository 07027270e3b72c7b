"""Option errors stand out in Spark: the stand-in stream reader and the traceback switch."""

from __future__ import annotations

import inspect
import os

import pytest

from connectors.options import parse_options
from connectors.plain_errors import FailedStreamReader, in_spark_worker, report_plainly
from connectors.source import DanubeDataSource
from danube_core.errors import ConfigError

pytestmark = pytest.mark.unit

BASE = {"etcd.endpoints": "127.0.0.1:1", "storage.url": "file:///x", "topic": "/default/t"}


def test_stream_reader_that_cannot_be_made_raises_on_sparks_first_call() -> None:
    reader = DanubeDataSource(dict(BASE)).streamReader(None)  # no subscription
    assert isinstance(reader, FailedStreamReader)
    reader.stop()  # what PySpark calls in its finally: must not raise
    for call in (reader.initialOffset, reader.getDefaultReadLimit, reader.prepareForTriggerAvailableNow):
        with pytest.raises(ConfigError, match="'subscription' is required for a streaming read"):
            call()
    # PySpark enables admission control from latestOffset's parameters
    assert len(inspect.signature(reader.latestOffset).parameters) == 2


def test_traceback_is_only_hidden_inside_a_spark_worker(monkeypatch) -> None:
    monkeypatch.delenv("SPARK_HIDE_TRACEBACK", raising=False)
    assert not in_spark_worker()
    report_plainly(ConfigError("bad"))
    assert "SPARK_HIDE_TRACEBACK" not in os.environ


def test_stream_reader_latest_offset_keeps_its_signature_when_decorated() -> None:
    from connectors.stream import DanubeStreamReader

    reader = DanubeStreamReader(parse_options({**BASE, "subscription": "s"}))
    assert list(inspect.signature(reader.latestOffset).parameters) == ["start", "limit"]
