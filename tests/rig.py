"""Small helpers shared by tests: polling with a deadline instead of sleeping."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def eventually(check: Callable[[], T], deadline_s: float = 20.0, interval_s: float = 0.05) -> T:
    """Call `check` until it returns a truthy value (returned) or the deadline passes.

    AssertionErrors raised by `check` are retried; the last one is re-raised at the deadline.
    """
    deadline = time.monotonic() + deadline_s
    last_error: AssertionError | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except AssertionError as exc:
            last_error = exc
        time.sleep(interval_s)
    if last_error is not None:
        raise last_error
    raise TimeoutError(f"condition not met within {deadline_s}s")
