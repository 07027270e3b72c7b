"""Worker liveness on the leader (seed §5): registration, heartbeats, pull status, disconnects.

Registration grants an etcd lease of `3 x heartbeat interval` and puts
`/workers/{tenant}/{worker}` with it; every heartbeat refreshes the lease (`worker_leases`:
the heartbeats of all workers batched into one etcd request per round), so a worker that
stops sending (killed, stopped, partitioned) loses its key within the TTL, which the leader's
watch turns into a reassignment after the grace period. What a registering worker already
holds is reconciled with the records instead of reloaded: a READY epoch the records place on
it stays; one whose epoch lacks replicas is adopted; anything else is dropped by the next sync.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import replace
from typing import Callable

from speedlayer.api.v1 import control_plane_service_pb2 as cp
from speedlayer.errors import InvalidRequestError, TenantIsolationError
from speedlayer.keys import valid_id
from speedlayer.master.state import ClusterState
from speedlayer.master.worker_leases import LeaseRefresher
from speedlayer.master.worker_streams import StreamRegistry, WorkerSession
from speedlayer.records import R_ASSIGNED, R_FAILED, R_LOADING, R_READY, AssignmentRecord, ReplicaRecord, WorkerRecord

logger = logging.getLogger(__name__)

Status = cp.DataPullStatusUpdateEvent


class WorkerDirectory:
    def __init__(self, state: ClusterState, registry: StreamRegistry, master_id: str,
                 heartbeat_interval_s: int, changed: Callable[[], None], leases: LeaseRefresher) -> None:
        self._state, self._registry, self._master_id = state, registry, master_id
        self._leases = leases
        self.heartbeat_interval_s = heartbeat_interval_s
        self._changed = changed

    @property
    def lease_ttl_s(self) -> int:
        return max(1, 3 * self.heartbeat_interval_s)

    def register(self, message: cp.EventStreamMessage) -> WorkerSession:
        tenant, worker = message.tenant_id, message.worker_id
        for name, value in (("tenant_id", tenant), ("worker_id", worker)):
            if not valid_id(value):
                raise InvalidRequestError(f"RegisterEvent {name}={value!r}: expected 1-128 of letters, digits, '_', '.', '-'")
        event = message.register_event
        lease = self._state.metadata.grant_lease(self.lease_ttl_s)
        record = WorkerRecord(address=event.address, memory_bytes=event.capacity.memory_bytes,
                              cpu_cores=event.capacity.cpu_cores, master_id=self._master_id,
                              metrics_address=event.metrics_address)
        self._state.metadata.put(self._state.keys.worker(tenant, worker), record.to_json(), lease=lease)
        session = WorkerSession(tenant=tenant, worker_id=worker, address=event.address,
                                capacity=event.capacity, lease=lease,
                                heartbeat_interval_s=self.heartbeat_interval_s)
        old = self._registry.add(session)
        if old is not None:
            old.close()
        self._reconcile_held(session, list(event.held_epochs))
        logger.info("worker %s/%s registered from %s holding %d epochs", tenant, worker, event.address,
                    len(event.held_epochs), extra={"tenant_id": tenant, "worker_id": worker})
        return session

    def _reconcile_held(self, session: WorkerSession, held: list[cp.HeldEpoch]) -> None:
        reported = {(e.dataset_id, e.epoch_id) for e in held if e.status == Status.COMPLETED}
        for record in self._state.records_on(session.key):
            replica = record.replicas.get(session.worker_id)
            if replica is None or replica.state == R_ASSIGNED or (record.dataset, record.epoch) in reported:
                continue
            # Placed here but not held (a restarted process): not READY until loaded again.
            self._state.update_record(record.tenant, record.dataset, record.epoch, functools.partial(
                _not_held, worker=session.worker_id))
        for epoch in held:
            ref = f"{epoch.dataset_id}/{epoch.epoch_id}"
            found = self._state.record(session.tenant, epoch.dataset_id, epoch.epoch_id)
            if found is None or not found.live:
                session.held[ref] = "STALE"  # dropped by the next sync
                continue
            if epoch.status != Status.COMPLETED:
                continue  # a half-done load: the next sync sends the plan again
            session.held[ref] = R_READY
            ready = ReplicaRecord(state=R_READY, rows=epoch.rows, bytes=epoch.bytes)

            def adopt(current: AssignmentRecord, worker: str = session.worker_id, epoch: cp.HeldEpoch = epoch,
                      ready: ReplicaRecord = ready) -> AssignmentRecord | None:
                if worker in current.replicas:
                    if current.replicas[worker].state == R_READY:
                        return None
                    return current.with_replica(worker, replace(current.replicas[worker], state=R_READY,
                                                                rows=epoch.rows, bytes=epoch.bytes))
                if len(current.staying()) < current.replication:
                    return current.with_replica(worker, ready)
                return None

            self._state.update_record(session.tenant, epoch.dataset_id, epoch.epoch_id, adopt)
        session.reported = True
        self._changed()

    def heartbeat(self, session: WorkerSession, message: cp.EventStreamMessage) -> cp.HeartbeatAckEvent:
        session.last_heartbeat = time.monotonic()
        session.memory_used_bytes = message.heartbeat_event.status.memory_used_bytes
        self._leases.heard(session)
        draining = self._state.is_draining((session.tenant, session.worker_id))
        action = cp.HeartbeatAckEvent.DRAIN if draining else cp.HeartbeatAckEvent.NONE
        return cp.HeartbeatAckEvent(requested_action=action)

    def pull_status(self, session: WorkerSession, message: cp.EventStreamMessage) -> None:
        update = message.data_pull_status_update
        claimed = (message.tenant_id or session.tenant, message.worker_id or session.worker_id)
        if claimed != session.key:
            raise TenantIsolationError(f"the stream of worker {session.worker_id} (tenant {session.tenant}) "
                                       f"carried an update for {claimed[1]} of tenant {claimed[0]}")
        ref = f"{update.dataset_id}/{update.epoch_id}"
        state = {Status.IN_PROGRESS: R_LOADING, Status.COMPLETED: R_READY, Status.FAILED: R_FAILED}.get(update.status)
        if state is None:
            return
        session.held[ref] = state
        session.reported = True

        def change(current: AssignmentRecord) -> AssignmentRecord | None:
            if session.worker_id not in current.replicas:
                return None
            replica = replace(current.replicas[session.worker_id], state=state, rows=update.rows,
                              bytes=update.bytes, seconds=update.seconds, error=update.error_message)
            if state == R_READY and not current.ready_ms:  # the lifecycle's clock: superseded since
                current = replace(current, ready_ms=int(time.time() * 1000))
            return current.with_replica(session.worker_id, replica)

        updated = self._state.update_record(session.tenant, update.dataset_id, update.epoch_id, change)
        extra = {"tenant_id": session.tenant, "worker_id": session.worker_id, "epoch_id": update.epoch_id}
        if updated is None:
            logger.warning("status %s for unknown epoch %s", state, ref, extra=extra)
        elif state == R_READY:
            logger.info("epoch %s READY on %s: %d rows in %.2fs", ref, session.worker_id, update.rows,
                        update.seconds, extra=extra)
        elif state == R_FAILED:
            logger.error("epoch %s FAILED on %s: %s", ref, session.worker_id, update.error_message, extra=extra)
        if updated is None or session.worker_id not in updated.replicas or state != R_LOADING:
            # dropped by the next sync, placed elsewhere (FAILED), or it settles an epoch (refresh, lifecycle)
            self._changed()

    def disconnected(self, session: WorkerSession) -> None:
        """The stream ended. The lease is left to expire (a quick reconnect keeps everything)."""
        if self._registry.remove(session):
            logger.warning("worker %s/%s disconnected", session.tenant, session.worker_id,
                           extra={"tenant_id": session.tenant, "worker_id": session.worker_id})
        session.close()
        self._changed()


def _not_held(record: AssignmentRecord, worker: str) -> AssignmentRecord | None:
    """`worker` re-registered without this epoch: a leaving replica is gone, any other is
    ASSIGNED again (the next sync sends the plan)."""
    replica = record.replicas.get(worker)
    if replica is None:
        return None
    return record.with_replica(worker, None if replica.leaving else replace(replica, state=R_ASSIGNED))
