"""Decisions by error type for errors that crossed the JVM as text (`error_type_in`)."""

from __future__ import annotations

import pytest

from danube_core.errors import (
    ConfigError, DataLossError, MetadataError, SubscriptionBusyError, WalUnreachableError, error_type_in,
)

pytestmark = pytest.mark.unit

# What a StreamingQueryException says when the source's Python process raised (shortened).
LOCKED = (
    "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: [PYTHON_STREAMING_DATA_SOURCE_"
    "RUNTIME_ERROR] Failed when Python streaming data source perform latestOffset: Traceback (most recent "
    "call last):\n  File \"/x/connectors/stream.py\", line 90, in _driver\n"
    "danube_core.errors.SubscriptionBusyError: subscription 'orders' is already consumed by a live query\n"
)


def test_the_class_is_recovered_from_a_spark_error_text() -> None:
    assert error_type_in(LOCKED) is SubscriptionBusyError
    assert error_type_in(LOCKED).retriable


def test_the_outermost_danube_error_wins() -> None:
    chained = ("danube_core.errors.MetadataError: etcd down\n\nThe above exception was the direct cause of "
               "the following exception:\n\ndanube_core.errors.DataLossError: gap at 5\n")
    assert error_type_in(chained) is DataLossError


@pytest.mark.parametrize("text, cls", [
    ("danube_core.errors.WalUnreachableError: no such dir", WalUnreachableError),
    ("... danube_core.errors.ConfigError: invalid value", ConfigError),
    ("danube_core.errors.MetadataError: lost the subscription lock", MetadataError),
])
def test_subclasses_stay_distinct(text: str, cls: type) -> None:
    assert error_type_in(text) is cls


@pytest.mark.parametrize("text", [
    "subscription 'orders' is already consumed by a live query",  # the words alone decide nothing
    "java.lang.OutOfMemoryError: heap",
    "danube_core.errors.NoSuchError: x",
    "pipelines.nonexistent_module.SomeError: x",
    "danube_core.keys.cursor_key: x",  # not an exception class
])
def test_no_danube_error_named(text: str) -> None:
    assert error_type_in(text) is None

