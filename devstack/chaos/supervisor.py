"""The soak's supervisor: restarts every part that exits, as systemd or Kubernetes would, and
records each exit it did not cause (a loud error) with the line of the log that says why.

A fault kills a part through `kill()` (kill -9 held down for the fault's length: the
supervisor restarts it when the hold ends) or pauses it through `pause()`/`resume()`; `heal()`
resumes everything paused and releases every hold.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

logger = logging.getLogger(__name__)

ERROR_MARKERS = ("Error:", "ERROR", "Traceback", "error:")


@dataclass
class Exit:
    """One exit of a part: when (seconds into the run), its code, and whether a fault caused it."""

    at_s: float
    part: str
    code: int | None
    by_fault: bool
    said: str = ""


@dataclass
class Part:
    """A supervised process: `start()` launches it and returns its Popen; `group`: signals go
    to its process group (a pipeline's driver, JVM and Python workers)."""

    name: str
    kind: str
    start: Callable[[], subprocess.Popen]
    log: Path | None = None
    group: bool = False
    process: subprocess.Popen | None = None
    held_until: float = 0.0
    killed_by_fault: bool = False
    paused: bool = False
    exit_recorded: bool = False
    starts: int = 0
    restarts_at: list[float] = field(default_factory=list)


class Supervisor:
    """Watches the parts twice a second; restarts the exited ones whose hold has ended."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.parts: dict[str, Part] = {}
        self.exits: list[Exit] = []
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="soak-supervisor", daemon=True)

    def add(self, part: Part) -> Part:
        """Start `part` now and supervise it from then on."""
        with self._lock:
            part.process = part.start()
            part.starts += 1
            self.parts[part.name] = part
        return part

    def run(self) -> None:
        self._thread.start()

    def pid(self, name: str) -> int | None:
        process = self.parts[name].process
        return process.pid if process is not None and process.poll() is None else None

    def kill(self, name: str, hold_s: float) -> None:
        """kill -9, restarted once `hold_s` has passed."""
        with self._lock:
            part = self.parts[name]
            part.held_until = time.monotonic() + hold_s
            part.killed_by_fault = True
            part.paused = False
            self._signal(part, signal.SIGKILL)

    def pause(self, name: str) -> None:
        with self._lock:
            part = self.parts[name]
            part.paused = True
            self._signal(part, signal.SIGSTOP)

    def resume(self, name: str) -> None:
        with self._lock:
            part = self.parts[name]
            if part.paused:
                part.paused = False
                self._signal(part, signal.SIGCONT)

    def heal(self) -> None:
        """Resume every paused part and let every held one restart at once."""
        with self._lock:
            for part in self.parts.values():
                self.resume(part.name)
                part.held_until = 0.0

    def all_running(self) -> list[str]:
        """The names of parts not running now (empty: all are)."""
        with self._lock:
            return [p.name for p in self.parts.values() if p.process is None or p.process.poll() is not None]

    def stop(self) -> None:
        """Stop watching, then every part: SIGCONT, SIGTERM, and SIGKILL after 20 s."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        with self._lock:
            parts = list(self.parts.values())
        for part in parts:
            self._signal(part, signal.SIGCONT)
            self._signal(part, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for part in parts:
            if part.process is None:
                continue
            try:
                part.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._signal(part, signal.SIGKILL)
                part.process.wait(10)
            if part.group:  # a pipeline's JVM outliving its driver
                self._signal(part, signal.SIGKILL)

    def _signal(self, part: Part, sig: int) -> None:
        process = part.process
        if process is None or process.poll() is not None and not part.group:
            return
        try:
            if part.group:
                os.killpg(process.pid, sig)
            else:
                process.send_signal(sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            with self._lock:
                for part in self.parts.values():
                    self._check(part)

    def _check(self, part: Part) -> None:
        process = part.process
        if process is None or process.poll() is None:
            return
        now = time.monotonic()
        if not part.exit_recorded:
            said = "" if part.killed_by_fault else _why(part.log)
            self.exits.append(Exit(round(now - self.started, 1), part.name, process.returncode, part.killed_by_fault,
                                   said))
            if not part.killed_by_fault:
                logger.warning("soak: %s exited %s: %s", part.name, process.returncode, said)
                part.held_until = now + 1.0  # a part failing at start is not restarted in a tight loop
            part.exit_recorded = True
        if now < part.held_until:
            return
        if part.group:
            self._signal(part, signal.SIGKILL)  # what the dead driver left behind
        part.process = part.start()
        part.starts += 1
        part.restarts_at.append(round(now - self.started, 1))
        part.killed_by_fault = False
        part.exit_recorded = False


def _why(log: Path | None, lines: int = 200) -> str:
    """The last line of a part's log that reads like an error (empty if none)."""
    if log is None or not log.exists():
        return ""
    with open(log, "rb") as handle:
        handle.seek(max(0, log.stat().st_size - 64_000))
        tail = handle.read().decode(errors="replace").splitlines()[-lines:]
    found = [line for line in tail if any(m in line for m in ERROR_MARKERS)]
    return (found[-1] if found else (tail[-1] if tail else "")).strip()[:300]
