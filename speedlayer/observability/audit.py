"""`AuditLogger` (seed §12): append-only audit events for admissions, assignments and failovers.

`JsonlAuditLogger` appends one JSON object per line to a file (flushed per event), so the
trail survives the process; `MemoryAuditLogger` keeps them for tests. Backends may change
(e.g. a dedicated service) without touching the master's logic.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AuditEvent:
    """`kind`: admission.PENDING/PLANNED/ASSIGNED/FAILED, assignment.moved, leader.elected, ..."""

    kind: str
    tenant: str = ""
    dataset: str = ""
    epoch: str = ""
    master_id: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    at_ms: int = field(default_factory=lambda: int(time.time() * 1000))


class AuditLogger(ABC):
    @abstractmethod
    def record(self, event: AuditEvent) -> None:
        """Append `event`; must not raise (an audit failure is logged, not propagated)."""


class JsonlAuditLogger(AuditLogger):
    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._file = open(path, "a", encoding="utf-8")

    def record(self, event: AuditEvent) -> None:
        line = json.dumps(asdict(event), sort_keys=True, separators=(",", ":"))
        try:
            with self._lock:
                self._file.write(line + "\n")
                self._file.flush()
        except OSError as exc:
            logger.error("audit event %s not written to %s: %s", event.kind, self.path, exc)

    def close(self) -> None:
        with self._lock:
            self._file.close()


class MemoryAuditLogger(AuditLogger):
    def __init__(self) -> None:
        self.events: list[AuditEvent] = []

    def record(self, event: AuditEvent) -> None:
        self.events.append(event)


def read_audit_log(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
