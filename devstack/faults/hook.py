"""A test hook: SIGKILL the driver at a named step of a batch, once. Inert unless armed.

The fault battery (`bench/faults.py`) and its tests arm it through the environment of a
`python -m devstack.faults.pipeline run` process (`python -m pipelines run` with `FaultHooks`
passed in as the sink's `pipelines.batch_hooks.BatchHooks`), to prove the sink's order
(target, quarantine, then the cursor) is exactly-once whichever step a crash interrupts:

    DANUBE_FAULT_AT=after_target_write[,during_cursor_commit...]
    DANUBE_FAULT_MARKERS=/tmp/markers        # one file per step that fired

Steps (`STEPS`): `during_target_write` (a timer kills the process `DANUBE_FAULT_DELAY_MS`,
default 300, after the target write started; if the write ends first, at its end),
`after_target_write` (between the target and the quarantine write), `after_quarantine_write`
(between the quarantine write and the cursor commit), `during_cursor_commit` (right after the
cursor's compare-and-put reached etcd, before the batch returns to Spark).

Each step fires once: its marker file is written (and fsynced) before the kill, so the
restarted pipeline runs through. Without `DANUBE_FAULT_AT` every function here does nothing.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator

from pipelines.batch_hooks import STEPS, BatchHooks

logger = logging.getLogger(__name__)

ENV_STEPS = "DANUBE_FAULT_AT"
ENV_MARKERS = "DANUBE_FAULT_MARKERS"
ENV_DELAY_MS = "DANUBE_FAULT_DELAY_MS"
_lock = threading.Lock()


def armed(step: str) -> bool:
    """Whether `step` is armed and has not fired yet (in this or an earlier process)."""
    steps = {s.strip() for s in os.environ.get(ENV_STEPS, "").split(",") if s.strip()}
    if not steps:
        return False
    unknown = steps - set(STEPS)
    if unknown:
        raise ValueError(f"{ENV_STEPS}={os.environ[ENV_STEPS]!r}: unknown step(s) {sorted(unknown)}; "
                         f"accepted: {', '.join(STEPS)}")
    return step in steps and not os.path.exists(_marker(step))


def fault_point(step: str) -> None:
    """SIGKILL this process here if `step` is armed (once: the marker is written first)."""
    if not armed(step):
        return
    with _lock:
        path = _marker(step)
        if os.path.exists(path):
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            fh.write(str(os.getpid()))
            fh.flush()
            os.fsync(fh.fileno())
        logger.warning("fault hook: SIGKILL at %s", step)
        os.kill(os.getpid(), signal.SIGKILL)


@contextmanager
def fault_window(step: str) -> Iterator[None]:
    """Kill the process while the `with` block runs (after the armed delay), else at its end."""
    if not armed(step):
        yield
        return
    delay_s = int(os.environ.get(ENV_DELAY_MS, "300")) / 1000.0
    timer = threading.Timer(delay_s, fault_point, (step,))
    timer.daemon = True
    timer.start()
    yield
    fault_point(step)


def faulting_store(store: Any) -> Any:
    """`store`, or (when `during_cursor_commit` is armed) a wrapper that dies after its first
    compare-and-put, i.e. with the cursor in etcd and the batch not yet done in Spark."""
    return _KillAfterCursorPut(store) if armed("during_cursor_commit") else store


class _KillAfterCursorPut:
    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def compare_and_put(self, *args: Any, **kwargs: Any) -> Any:
        result = self._store.compare_and_put(*args, **kwargs)
        fault_point("during_cursor_commit")
        return result

    def guarded_put(self, *args: Any, **kwargs: Any) -> Any:
        result = self._store.guarded_put(*args, **kwargs)
        fault_point("during_cursor_commit")
        return result


def _marker(step: str) -> str:
    return os.path.join(os.environ.get(ENV_MARKERS) or ".", f"fault-{step}.fired")


class FaultHooks(BatchHooks):
    """The sink's hooks that kill the driver at each armed step (see the module doc)."""

    def at(self, step: str) -> None:
        fault_point(step)

    @contextmanager
    def around(self, step: str) -> Iterator[None]:
        with fault_window(step):
            yield

    def cursor_store(self, store: Any) -> Any:
        return faulting_store(store)
