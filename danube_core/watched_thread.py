"""A background thread woken by a prefix watch: the shape of the election's and the refresher's loops.

The owner's loop runs on the thread and waits on `wake_event` between passes; every event
under the watched prefix (or an explicit `wake()`) cuts the wait short, and `stop()` ends it:
stop flag, wake, cancel the watch, join (not when called from the thread itself).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from danube_core.metadata import MetadataStore, WatchEvent, WatchHandle


class WatchedThread:
    """A daemon thread running `target` until `stop()`, woken by a watch on one prefix."""

    def __init__(self, name: str, target: Callable[[], None]) -> None:
        self.wake_event = threading.Event()
        self.stop_event = threading.Event()
        self._watch: WatchHandle | None = None
        self._thread = threading.Thread(target=target, name=name, daemon=True)

    def start(self, metadata: MetadataStore, prefix: str,
              on_event: Callable[[WatchEvent], None] | None = None) -> None:
        """Watch `prefix` (each event calls `on_event`, by default a plain `wake()`), then start."""
        self._watch = metadata.watch_prefix(prefix, on_event if on_event is not None else self._woken)
        self._thread.start()

    def wake(self) -> None:
        self.wake_event.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the loop and the watch; wait up to `timeout_s` for a pass under way."""
        self.stop_event.set()
        self.wake_event.set()
        if self._watch is not None:
            self._watch.cancel()
        if self._thread is not threading.current_thread() and self._thread.is_alive():
            self._thread.join(timeout=timeout_s)

    def _woken(self, event: WatchEvent) -> None:
        self.wake_event.set()
