"""The `StreamRegistry` (seed §12): the master's view of the workers connected to this leader, one session each.

A `WorkerSession` owns a worker's outgoing queue and what the master knows of it: what it
reported holding (`held`: epoch key -> replica state) and which plans were sent (`sent`).
The gRPC handler drains the queue into the stream; anything may enqueue from any thread.
"""

from __future__ import annotations

import enum
import itertools
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from danube_core.metadata import Lease

from speedlayer.api.v1 import control_plane_service_pb2 as cp

class _Close(enum.Enum):
    CLOSE = "close"


CLOSE = _Close.CLOSE  # queued to end a session's stream (an enum member, so `is CLOSE` narrows)
_event_ids = itertools.count(1)


@dataclass
class WorkerSession:
    tenant: str
    worker_id: str
    address: str
    capacity: cp.WorkerCapacity
    lease: Lease
    heartbeat_interval_s: float
    outgoing: "queue.Queue[cp.EventStreamMessage | _Close]" = field(default_factory=queue.Queue)
    held: dict[str, str] = field(default_factory=dict)
    sent: set[str] = field(default_factory=set)
    memory_used_bytes: int = 0
    last_heartbeat: float = field(default_factory=time.monotonic)
    closed: bool = False
    # Set after `held` changes (a status report, registration), cleared by the reconciler's
    # sync before it reads `held`: a pass syncs only the sessions whose epochs or reports
    # changed, not all 100 workers on every change of one.
    reported: bool = True

    @property
    def key(self) -> tuple[str, str]:
        return (self.tenant, self.worker_id)

    def send(self, **payload: Any) -> None:
        """Queue a message carrying `payload`, one field of its `payload` oneof (the protobuf
        constructor checks the field and its type)."""
        if not self.closed:
            self.outgoing.put(cp.EventStreamMessage(event_id=f"m{next(_event_ids)}", tenant_id=self.tenant,
                                                    worker_id=self.worker_id, **payload))

    def close(self) -> None:
        self.closed = True
        self.outgoing.put(CLOSE)

    def overdue(self, misses: int = 3) -> bool:
        return time.monotonic() - self.last_heartbeat > misses * self.heartbeat_interval_s


class StreamRegistry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: dict[tuple[str, str], WorkerSession] = {}

    def add(self, session: WorkerSession) -> WorkerSession | None:
        """Register `session`; returns the one it replaces (a worker that reconnected)."""
        with self._lock:
            old = self._sessions.get(session.key)
            self._sessions[session.key] = session
        return old

    def remove(self, session: WorkerSession) -> bool:
        with self._lock:
            if self._sessions.get(session.key) is session:
                del self._sessions[session.key]
                return True
        return False

    def get(self, tenant: str, worker: str) -> WorkerSession | None:
        with self._lock:
            return self._sessions.get((tenant, worker))

    def all(self) -> list[WorkerSession]:
        with self._lock:
            return list(self._sessions.values())

    def close_all(self) -> None:
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            session.close()
