"""Stopping a worker's query once the gateway's own caller has gone.

A client that cancels its call, or whose deadline passes, cannot reach the handler serving it:
that handler is blocked in its call to the worker (pyarrow's DoGet returns once the worker has
sent its schema, which a worker does after computing the first batch, so errors come before any
data), or waiting for an answer started ahead on another thread. So one thread polls the
callers' contexts, and for each that is cancelled calls `on_gone` with the query id the gateway
gave the query; the gateway then asks every worker running it to stop it (`CANCEL_ACTION`), and
the worker interrupts DuckDB as at its deadline. A context is touched only while its call is
being served: entries are removed under the lock the poller holds before the handler returns.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

logger = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.05


def new_query_id() -> str:
    """An id for one query the gateway forwards (the ticket's `query_id`), unguessable by others."""
    return secrets.token_hex(12)


@dataclass
class _Watched:
    context: Any  # flight.ServerCallContext of the caller's call
    query_id: str
    gone: bool = False


class CallerWatch:
    """Calls `on_gone(query_id)` once for each watched query whose caller's call is cancelled."""

    def __init__(self, on_gone: Callable[[str], None], interval_s: float = POLL_INTERVAL_S) -> None:
        self._on_gone = on_gone
        self._interval_s = interval_s
        self._watched: dict[int, _Watched] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @contextmanager
    def watching(self, context: Any, query_id: str) -> Iterator[None]:
        """Watch `context` for the duration of the block (no-op without a context or an id)."""
        if context is None or not query_id:
            yield
            return
        entry = _Watched(context, query_id)
        with self._lock:
            self._watched[id(entry)] = entry
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="caller-watch", daemon=True)
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._watched.pop(id(entry), None)

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            with self._lock:
                gone = [entry for entry in self._watched.values() if not entry.gone and entry.context.is_cancelled()]
                for entry in gone:
                    entry.gone = True
            for entry in gone:
                noticed = time.monotonic()
                try:
                    self._on_gone(entry.query_id)
                except Exception:  # a worker that cannot be told still stops at the query's deadline
                    logger.warning("could not stop query %s after its caller went", entry.query_id, exc_info=True)
                    continue
                logger.info("caller of query %s gone (noticed at monotonic %.6f): its workers told in %.1f ms",
                            entry.query_id, noticed, (time.monotonic() - noticed) * 1000)
