"""`broker.grpc_front`: "auto" serves without the native front where it was not built and
says so once; an explicit "native" without it stops the broker naming key, extension and fix.

The missing extension is simulated (None in sys.modules makes its import fail), so these run
whether or not this checkout built `broker._grpc_front`.
"""

from __future__ import annotations

import logging
import sys
import types

import pytest

from broker.config import parse_config
from broker.send_front import use_native_front
from danube_core.errors import ConfigError

pytestmark = pytest.mark.unit


@pytest.fixture
def without_native_front(monkeypatch):
    monkeypatch.setitem(sys.modules, "broker._grpc_front", None)


@pytest.fixture
def with_native_front(monkeypatch):
    monkeypatch.setitem(sys.modules, "broker._grpc_front", types.ModuleType("broker._grpc_front"))


def test_default_is_auto():
    assert parse_config({}, "my.yaml").listener.grpc_front == "auto"


def test_auto_without_the_extension_serves_with_python_and_says_so_once(without_native_front, caplog):
    with caplog.at_level(logging.WARNING, logger="broker.send_front"):
        assert use_native_front("auto", "my.yaml") is False
    [record] = caplog.records
    message = record.getMessage()
    assert "broker._grpc_front" in message and "300 µs" in message and "cargo" in message


def test_auto_with_the_extension_uses_it_quietly(with_native_front, caplog):
    with caplog.at_level(logging.WARNING, logger="broker.send_front"):
        assert use_native_front("auto", "my.yaml") is True
    assert caplog.records == []


def test_explicit_native_without_the_extension_fails_naming_key_extension_and_fix(without_native_front):
    with pytest.raises(ConfigError) as info:
        use_native_front("native", "my.yaml")
    message = str(info.value)
    assert "my.yaml" in message and "broker.grpc_front" in message and "'native'" in message
    assert "broker._grpc_front" in message and "cargo" in message and "grpc_front: auto" in message


def test_explicit_native_with_the_extension(with_native_front):
    assert use_native_front("native", "my.yaml") is True


def test_python_never_looks_for_the_extension(without_native_front, caplog):
    with caplog.at_level(logging.WARNING, logger="broker.send_front"):
        assert use_native_front("python", "my.yaml") is False
    assert caplog.records == []
