"""Small helpers shared by tests: polling with a deadline instead of sleeping, metadata store doubles,
subprocess output checks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any, Callable, TypeVar

from devstack import REPO_ROOT

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


class CompactsAfterFirstRead:
    """Mixin for a metadata store (memory or etcd): right after the first `range_at`, writes
    `key` and `key + "2"` and compacts past the revision that read saw (`compacted_at`)."""

    key = ""
    compacted = False
    compacted_at = 0

    def range_at(self, start_key, end_key, revision=None):
        read = super().range_at(start_key, end_key, revision)
        if not self.compacted:
            self.compacted = True
            self.put(self.key, b"after the read")
            self.compacted_at = self.put(self.key + "2", b"after the read")
            self.compact(self.compacted_at)
        return read


def one_line(stderr: str) -> str:
    """The one line a command that fails cleanly writes to stderr (no traceback)."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def run_module(module: str, *args: str, timeout_s: float = 60.0,
               env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """`python -m module args...` from the checkout, output captured (`env`: variables to set
    or, with an empty value, to remove): the result and its seconds."""
    environ = {**os.environ, **(env or {})}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          timeout=timeout_s, cwd=REPO_ROOT, env={k: v for k, v in environ.items() if v})
    return done, time.perf_counter() - started
