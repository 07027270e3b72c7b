"""tests.rig: a wait that fails says which condition, with what value, or why the query died."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


class _Query:
    def __init__(self, progress: dict | None, active: bool, error: str | None = None) -> None:
        self.lastProgress, self.isActive, self.name, self.id = progress, active, "q", "id"
        self._error = error

    def exception(self) -> str | None:
        return self._error


def test_a_dead_query_fails_the_wait_at_once_with_its_own_error() -> None:
    from tests.rig import query_reached

    assert query_reached(_Query({"batchId": 1}, True), 1)
    assert not query_reached(_Query(None, True))
    assert not query_reached(_Query({"batchId": 0}, True), 1)
    with pytest.raises(RuntimeError, match="stopped before batch 0: Python worker failed to connect back"):
        query_reached(_Query(None, False, "Python worker failed to connect back"))


def test_a_timeout_names_the_condition_and_its_last_value() -> None:
    from tests.rig import eventually

    with pytest.raises(TimeoutError) as info:
        eventually(lambda: 41 == 42 or "cursor at 41" * 0, 0.1)
    message = str(info.value)
    assert "41 == 42" in message and "test_rig.py" in message and "last value ''" in message
