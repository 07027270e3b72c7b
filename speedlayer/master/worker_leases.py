"""Worker leases kept alive by the leader: each heartbeat refreshes its worker's lease, and all
the heartbeats that arrived while a refresh was under way are refreshed together.

A worker's key `/workers/{tenant}/{worker}` lives on a lease of 3 heartbeat intervals that
its heartbeats refresh (seed §5). Refreshed one by one, in the heartbeat's handler, each refresh
was an etcd LeaseKeepAlive stream of its own (and a thread gRPC starts for it): at 100 workers
and a 1 s heartbeat, 100 streams a second, a quarter of a core on the leader at rest, taken from
admissions. Here one thread refreshes the leases of every session heard from since its last
round in one request (`MetadataStore.refresh_leases`): alone, a heartbeat's lease is refreshed
at once; under load, a round waits at most for the round before it, well inside the TTL.

A lease etcd no longer knows closes its session, so the worker registers again (as a refresh
failing inside the heartbeat did); etcd unreachable is logged, and the next heartbeat tries again.
"""

from __future__ import annotations

import logging
import threading

from danube_core.errors import DanubeError
from danube_core.metadata import MetadataStore

from speedlayer.master.worker_streams import WorkerSession

logger = logging.getLogger(__name__)


class LeaseRefresher:
    """`heard(session)` from any thread; one thread of its own refreshes, from `start` to `stop`."""

    def __init__(self, metadata: MetadataStore) -> None:
        self._metadata = metadata
        self._lock = threading.Lock()
        self._heard: dict[int, WorkerSession] = {}  # id(session) -> session, heard since the last round
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="worker-leases", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10.0)

    def heard(self, session: WorkerSession) -> None:
        """`session`'s worker sent a heartbeat: its lease is refreshed by the next round."""
        with self._lock:
            self._heard[id(session)] = session
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            if not self._stop.is_set():
                self._run_round()

    def _run_round(self) -> None:
        with self._lock:
            sessions, self._heard = list(self._heard.values()), {}
        sessions = [s for s in sessions if not s.closed]
        if sessions:
            self.refresh(sessions)

    def refresh(self, sessions: list[WorkerSession]) -> None:
        """One round: refresh `sessions`' leases; close the sessions whose lease has expired."""
        try:
            expired = {lease.id for lease in self._metadata.refresh_leases([s.lease for s in sessions])}
        except DanubeError as exc:
            logger.warning("refreshing %d workers' leases failed (their next heartbeats try again): %s",
                           len(sessions), exc)
            return
        for session in sessions:
            if session.lease.id in expired:
                logger.warning("closing the stream of %s: its lease (%x) has expired", session.worker_id,
                               session.lease.id, extra={"tenant_id": session.tenant, "worker_id": session.worker_id})
                session.close()
