"""`query_reached`: waiting for a streaming query says why it died instead of timing out."""

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
