"""How a speed layer process is told to stop: SIGINT or SIGTERM calls its `stop`.

Masters, workers and gateways run until one of these signals; each role's `process` module
passes the function that ends its serving loop.
"""

from __future__ import annotations

import signal
from typing import Callable


def stop_on_signals(stop: Callable[[], None]) -> None:
    """Call `stop` on SIGINT or SIGTERM (from the main thread, where Python runs handlers)."""

    def handler(signum: int, frame: object) -> None:
        stop()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)
