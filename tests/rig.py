"""Small helpers shared by tests: polling with a deadline instead of sleeping."""

from __future__ import annotations

import time
from typing import Any, Callable, TypeVar

T = TypeVar("T")


def eventually(check: Callable[[], T], deadline_s: float = 20.0, interval_s: float = 0.05) -> T:
    """Call `check` until it returns a truthy value (returned) or the deadline passes.

    AssertionErrors raised by `check` are retried; the last one is re-raised at the deadline.
    """
    deadline = time.monotonic() + deadline_s
    last_error: AssertionError | None = None
    result: Any = None
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
    raise TimeoutError(f"condition not met within {deadline_s}s: {_describe(check)} (last value {result!r})")


def _describe(check: Callable[..., Any]) -> str:
    """Where a polled condition is written (its source line), so a timeout names the fault."""
    import inspect

    try:
        line = inspect.getsourcelines(check)[0][0].strip()
        where = f"{inspect.getsourcefile(check)}:{check.__code__.co_firstlineno}"
    except (OSError, TypeError, AttributeError):
        return repr(check)
    return f"{line}  [{where}]"


class CountingStore:
    """A metadata store proxy counting the requests that reach the store, per method name.

    `reads` counts the requests a cache should spare: get, get_prefix, get_range, range_at.
    """

    READS = ("get", "get_prefix", "get_range", "range_at")

    def __init__(self, store) -> None:
        self._store = store
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str):
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr

        def counted(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            return attr(*args, **kwargs)

        return counted

    @property
    def reads(self) -> int:
        return sum(self.calls.get(name, 0) for name in self.READS)

    @property
    def requests(self) -> int:
        return sum(self.calls.values())


def query_reached(query: Any, batch_id: int = 0) -> bool:
    """For `eventually`: whether a streaming query has reported progress of `batch_id` or later.

    A query that already stopped makes this raise at once with the query's own error, so a
    test says why its query died (a source error, a Python worker that could not connect back
    under load, ...) instead of waiting out its deadline for progress that cannot come.
    """
    progress = query.lastProgress
    if progress is not None and progress["batchId"] >= batch_id:
        return True
    if not query.isActive:
        raise RuntimeError(f"query {query.name or query.id} stopped before batch {batch_id}: {query.exception()}")
    return False
