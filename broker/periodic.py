"""A cycle run now and then every few seconds on a daemon thread: the uploader's and WAL retention's.

`stop()` waits for a cycle under way (it is not interrupted: a cycle leaves its files and keys
consistent only at its end) and the task can be started again afterwards (a topic unloaded and
loaded again). A cycle handles its own errors: one that raises ends the thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class PeriodicTask:
    """Runs `cycle()` at `start`, then every `interval_s` seconds, until `stop()`."""

    def __init__(self, name: str, cycle: Callable[[], None]) -> None:
        self._name = name
        self._cycle = cycle
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def stopping(self) -> bool:
        """True once `stop()` was called: a long cycle may end early."""
        return self._stop.is_set()

    def start(self, interval_s: float, *, first_now: bool = True) -> None:
        """`first_now=False`: the first cycle comes `interval_s` after the start (the caller ran one)."""
        if self._thread is not None:
            raise RuntimeError(f"{self._name} is already running")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, args=(interval_s, first_now), name=self._name,
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread after its current cycle."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _loop(self, interval_s: float, first_now: bool = True) -> None:
        if not first_now and self._stop.wait(interval_s):
            return
        while True:
            self._cycle()
            if self._stop.wait(interval_s):
                return
