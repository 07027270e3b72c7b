"""The leader's placement loop: keeps every live epoch placed and every connected worker in sync.

Level-triggered: each pass reads the leader's `ClusterState`, computes the next placement
(`placement.next_placement`), persists changed records, then tells each connected worker what
to load or drop. Woken by any change (worker joined or lost, drain, admission, config) and by
the end of a lost worker's grace period (`reassign_delay_s`), so a quick restart keeps its
epochs and causes no reload storm.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from functools import partial
from typing import Callable

from danube_core.errors import DanubeError

from speedlayer.master.desired import DesiredEpochs
from speedlayer.master.lifecycle import Eviction, evictions
from speedlayer.master.load_failures import failed_everywhere, replication_target, retire_failed_replicas
from speedlayer.master.placement import EpochPlacement, balanced, next_placement
from speedlayer.master.record_index import EPOCH_STATUSES, epoch_counts, worker_loads_of

__all__ = ["EPOCH_STATUSES", "Reconciler", "candidates_from", "candidates_of", "epoch_counts", "placed_as_is"]
from speedlayer.master.sharded_epochs import cascaded, rolled_up
from speedlayer.master.state import ClusterState, ConfigView
from speedlayer.master.strategies import AssignmentStrategy, Candidate, PlanSummary
from speedlayer.master.worker_streams import StreamRegistry, WorkerSession
from speedlayer.observability.audit import AuditEvent, AuditLogger
from speedlayer.observability.metrics import EVICTIONS, WORKERS_REGISTERED, set_epoch_counts
from speedlayer.records import (
    ASSIGNED, EVICTED, FAILED, PLANNED, R_FAILED, R_READY, AssignmentRecord, ReplicaRecord, WorkerRecord,
)

logger = logging.getLogger(__name__)

IDLE_CHECK_S = 1.0
MAX_REST_S = 0.5  # the longest rest after a pass (see Reconciler._run)
EXPORT_INTERVAL_S = 1.0  # the epoch gauges are set at most this often (Reconciler._export_counts)


def candidates_of(records: list[AssignmentRecord], sessions: list[WorkerSession],
                  registered: dict[tuple[str, str], WorkerRecord],
                  draining: set[tuple[str, str]]) -> list[Candidate]:
    """Live workers as placement candidates, with what records already put on them: those
    connected here, and those still registered in etcd (e.g. reconnecting after a leader
    change: they get their plans when they connect)."""
    return candidates_from(worker_loads_of(records), sessions, registered, draining)


def candidates_from(loads: dict[tuple[str, str], tuple[int, int]], sessions: list[WorkerSession],
                    registered: dict[tuple[str, str], WorkerRecord],
                    draining: set[tuple[str, str]]) -> list[Candidate]:
    """`candidates_of` with the workers' loads ((tenant, worker) -> (bytes, replicas)) known:
    the leader keeps them per change (`ClusterState.worker_loads`)."""
    memory = {key: w.memory_bytes for key, w in registered.items()}
    memory.update({s.key: s.capacity.memory_bytes for s in sessions if not s.closed})
    return [Candidate(worker_id=key[1], tenant=key[0], memory_bytes=size,
                      assigned_bytes=loads.get(key, (0, 0))[0], epoch_count=loads.get(key, (0, 0))[1],
                      draining=key in draining)
            for key, size in sorted(memory.items())]


def placed_as_is(counts: dict[tuple[str, str], int], short: list[AssignmentRecord], candidates: list[Candidate],
                 keep: set[tuple[str, str]], max_failures: int) -> bool:
    """True when `next_placement` would change nothing, decided from the leader's index in
    O(workers + epochs short of replicas) (`counts`, `short`: `RecordIndex.placement_counts`
    and `.short`): no placed epoch is short of its replication target, none stays on a worker
    that is neither usable (a candidate, not draining) nor kept, and each tenant's counts per
    worker already pass `_balance`'s test. Else the full placement runs (which may still change
    nothing, e.g. for an epoch no worker has room for)."""
    if any(len(r.staying()) < replication_target(r, max_failures) for r in short):
        return False
    pools: dict[str, dict[str, Candidate]] = {}
    for c in candidates:
        pools.setdefault(c.tenant, {})[c.worker_id] = c
    for tenant, worker in counts:
        candidate = pools.get(tenant, {}).get(worker)
        if (candidate is None or candidate.draining) and (tenant, worker) not in keep:
            return False
    for tenant in {tenant for tenant, _ in counts}:
        targets = sorted(w for w, c in pools.get(tenant, {}).items() if not c.draining)
        if len(targets) >= 2 and not balanced({w: counts.get((tenant, w), 0) for w in targets}):
            return False
    return True


class Reconciler:
    def __init__(self, state: ClusterState, registry: StreamRegistry, config: ConfigView,
                 strategy: Callable[[], AssignmentStrategy], audit: AuditLogger, master_id: str,
                 takeover_grace_s: float = 0.0) -> None:
        self._state, self._registry, self._config = state, registry, config
        # After an election, workers need up to a lease TTL, an election and a reconnect backoff
        # to find the new leader; until then (plus the reassignment delay) none of them counts
        # as lost: a new leader reconciles, it does not reassign everything.
        self._takeover_grace_s = takeover_grace_s
        self._strategy, self._audit, self._master_id = strategy, audit, master_id
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reconciler", daemon=True)
        self._settled_at: tuple[int, int] | None = None  # the state's generation after a pass with no clock pending
        self._placements: dict[str, tuple[AssignmentRecord, int, EpochPlacement]] = {}
        self._desired: dict[tuple[str, str], dict[str, AssignmentRecord]] = {}  # DesiredEpochs.by_worker, kept
        self._counts_generation = -1
        self._synced_superseded: frozenset[tuple[str, str, str]] | None = None  # as of the last pass's syncs
        self._exported_at = -EXPORT_INTERVAL_S  # monotonic time the epoch gauges were last set

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10.0)

    def wake(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        woken = True
        while not self._stop.is_set():
            self._wake.clear()
            timeout = IDLE_CHECK_S
            started = time.monotonic()
            if not woken and self._quiet():
                self._wake.wait(timeout)  # the idle check with nothing to look at: no pass
                woken = self._wake.is_set()
                continue
            try:
                timeout = self.run_once()
            except DanubeError as exc:
                self._settled_at = None
                logger.warning("reconciliation pass failed, retrying: %s", exc)
            except Exception:
                self._settled_at = None
                logger.exception("reconciliation pass failed")
            # Woken by every change, passes would run back to back under a stream of admissions
            # and status reports, holding the GIL from the gRPC threads. Resting as long as the
            # pass took keeps it to half a core; changes meanwhile are taken by the next pass
            # together. (A pass reads what it needs from the records' index, O(workers) plus the
            # records that changed, unless placement has something to do: then O(records).)
            self._stop.wait(min(time.monotonic() - started, MAX_REST_S))
            woken = self._wake.wait(timeout)

    def _quiet(self) -> bool:
        """Whether an idle check (not woken) may skip its pass: the last pass ended with nothing
        waiting on the clock (a lost worker's grace period, the takeover window, a superseded
        epoch's TTL, an EVICTED record's retention) and no record, worker or drain changed
        since. Everything else that moves epochs (sessions, configs, admissions) wakes the loop."""
        return self._settled_at is not None and self._settled_at == self._state.generation()

    def run_once(self) -> float:
        """One pass; returns how long to wait before the next unless woken."""
        self._retire_failed()
        _, workers, lost_since, draining = self._state.snapshot()
        sessions = self._registry.all()
        connected = {s.key for s in sessions if not s.closed}
        delay = self._config.global_config.reassign_delay_s
        now = time.monotonic()
        grace_end = self.takeover_end()
        taking_over = self._state.known_at_takeover if now < grace_end else set()
        in_grace = {k for k, since in lost_since.items()
                    if (now - since < delay or k in taking_over) and k not in connected}
        keep = in_grace
        self._update_gauges(sessions)
        self._apply_lifecycle()
        candidates = candidates_from(self._state.worker_loads(), sessions,
                                     self._state.placeable_workers(now < grace_end), draining)
        max_failures = self._config.global_config.max_load_failures
        live = set(workers) | connected
        if not placed_as_is(*self._state.placement_view(), candidates, keep, max_failures):
            records, old, _ = self._state.view()  # old: superseded, neither refilled nor balanced (evicted later)
            placing = self._placements_of(records, old, max_failures, self._state.placing_now())
            moves = next_placement([p for _, p in placing.values()], candidates, keep, self._strategy())
            for key, workers_next in moves.items():
                self._move(placing[key][0], workers_next, live)
        leaving, failing = self._state.records_named("leaving"), self._state.records_named("load_failed")
        for record in leaving:
            self._retire_leaving(record, live)
        for record in failing:
            self._fail_if_unplaceable(record, max_failures)
        self._roll_up_shards()
        changed = self._state.take_desired()  # only the workers whose epochs changed
        for worker_key, held in changed.items():
            if held:
                self._desired[worker_key] = held
            else:
                self._desired.pop(worker_key, None)
        old = self._state.superseded()
        desired = DesiredEpochs(self._desired, old)  # once for every worker
        everyone = old != self._synced_superseded  # what is superseded decides what is (re)sent
        for session in self._registry.all():
            if everyone or session.reported or session.key in changed:
                self.sync(session, desired)
        self._synced_superseded = old
        waits = [max(since + delay, grace_end if k in taking_over else 0.0) - now
                 for k, since in lost_since.items() if k in in_grace]
        export_wait = self._export_counts()
        if export_wait is not None:
            waits.append(export_wait)
        timed = bool(waits) or now < grace_end or bool(old) or bool(self._state.records_named("evicted"))
        self._settled_at = None if timed else self._state.generation()
        return max(0.05, min([IDLE_CHECK_S, *waits]))

    def _export_counts(self) -> float | None:
        """Set the epoch gauges if a count may have moved, at most every `EXPORT_INTERVAL_S`:
        the counts are 5 series per dataset (10,000 at 2,000 datasets); `set_epoch_counts`
        touches only the series that moved, but finding them is still a walk over all of them,
        and during admissions a count moves after nearly every pass. Returns the seconds until
        counts that moved since can be set (None: nothing waits)."""
        if self._state.counts_generation() == self._counts_generation:
            return None
        now = time.monotonic()
        if now - self._exported_at < EXPORT_INTERVAL_S:
            return self._exported_at + EXPORT_INTERVAL_S - now
        self._counts_generation, counts = self._state.epoch_counts()
        set_epoch_counts(*counts)
        self._exported_at = now
        return None

    def _placements_of(self, records: list[AssignmentRecord], old: frozenset[tuple[str, str, str]],
                       max_failures: int, admitting: frozenset[tuple[str, str, str]] = frozenset(),
                       ) -> dict[str, tuple[AssignmentRecord, EpochPlacement]]:
        """`{epoch key: (record, placement)}` of the epochs to place: PLANNED or ASSIGNED, not
        superseded, not sharded (a sharded epoch's shards are placed, not the epoch), not one an
        admission is placing (`admitting`, while it has no replica). Each placement is kept while
        its record (immutable) and `max_failures` stay the same."""
        known, fresh = self._placements, {}
        for r in records:
            ref = (r.tenant, r.dataset, r.epoch)
            if r.status not in (PLANNED, ASSIGNED) or r.sharded or ref in old or (ref in admitting and not r.replicas):
                continue
            key = f"{r.tenant}/{r.dataset}/{r.epoch}"
            cached = known.get(key)
            if cached is None or cached[0] is not r or cached[1] != max_failures:
                cached = (r, max_failures, EpochPlacement(
                    PlanSummary(r.tenant, r.dataset, r.epoch, r.estimated_memory_bytes),
                    replication_target(r, max_failures), r.staying(), frozenset(r.load_failures)))
            fresh[key] = cached
        self._placements = fresh
        return {key: (record, placement) for key, (record, _, placement) in fresh.items()}

    def takeover_end(self) -> float:
        """Monotonic time until which this new leader counts no previously registered worker as lost."""
        return self._state.loaded_at + self._takeover_grace_s + self._config.global_config.reassign_delay_s

    def make_room(self, tenant: str, size: int) -> None:
        """Evict the tenant's least recently served superseded epochs until `size` more fits."""
        self._apply_lifecycle(lambda t: size if t == tenant else 0)
        self.wake()

    def _apply_lifecycle(self, need: Callable[[str], int] = lambda tenant: 0) -> None:
        """Evict what the Epoch Lifecycle says (TTL, LRU within quotas); delete EVICTED records
        (and their plans) after `evicted_retention_s`. Only superseded epochs are ever evicted:
        with none (the index knows), there is nothing to compute."""
        now_ms = int(time.time() * 1000)
        config = self._config
        ttl = lambda tenant: config.tenant(tenant).epoch_ttl_s or config.global_config.default_ttl_sec  # noqa: E731
        records, old, _ = self._state.view()
        found = evictions(records, now_ms, ttl, lambda tenant: config.tenant(tenant).memory_quota_bytes,
                          need) if old else []
        for eviction in found:
            record = eviction.record
            updated = self._state.update_record(record.tenant, record.dataset, record.epoch,
                                                partial(_evicted, why=eviction))
            if updated is not None and updated.status == EVICTED:
                EVICTIONS.labels(reason=eviction.reason).inc()
                self._audit.record(AuditEvent(kind="epoch.EVICTED", tenant=record.tenant, dataset=record.dataset,
                                              epoch=record.epoch, master_id=self._master_id,
                                              detail={"reason": eviction.reason, "detail": eviction.detail,
                                                      "workers": sorted(record.replicas)}))
                logger.info("epoch %s of %s/%s evicted (%s)", record.epoch, record.tenant, record.dataset,
                            eviction.detail, extra={"tenant_id": record.tenant, "epoch_id": record.epoch})
        retention_ms = int(config.global_config.evicted_retention_s * 1000)
        for record in self._state.records_named("evicted"):
            if now_ms - record.updated_ms >= retention_ms:
                self._state.delete_record(record)

    def _update_gauges(self, sessions: list[WorkerSession]) -> None:
        counts: dict[str, int] = {}
        for session in sessions:
            counts[session.tenant] = counts.get(session.tenant, 0) + 1
        for tenant in set(counts) | set(self._config.tenants):
            WORKERS_REGISTERED.labels(tenant=tenant).set(counts.get(tenant, 0))

    def _move(self, record: AssignmentRecord, workers: tuple[str, ...], live: set[tuple[str, str]]) -> None:
        """Place `record` on `workers`. A READY replica on a live worker that is no longer
        wanted becomes `leaving` (still held and queryable) instead of being dropped at once."""
        def change(current: AssignmentRecord) -> AssignmentRecord | None:
            if current.staying() != record.staying():
                return None  # changed since the snapshot; the next pass looks again
            replicas = {w: replace(current.replicas.get(w, ReplicaRecord()), leaving=False) for w in workers}
            for worker, replica in current.replicas.items():
                if worker in replicas:
                    continue
                if replica.state == R_READY and (current.tenant, worker) in live and replicas:
                    replicas[worker] = replace(replica, leaving=True)
            status = ASSIGNED if replicas else current.status
            return replace(current, replicas=replicas, status=status,
                           message="" if len(workers) >= current.replication else current.message)

        updated = self._state.update_record(record.tenant, record.dataset, record.epoch, change)
        if updated is None or set(updated.staying()) != set(workers):
            return
        added = sorted(set(workers) - set(record.staying()))
        removed = sorted(set(record.staying()) - set(workers))
        kind = "admission.ASSIGNED" if record.status == PLANNED else "assignment.moved"
        self._audit.record(AuditEvent(kind=kind, tenant=record.tenant, dataset=record.dataset,
                                      epoch=record.epoch, master_id=self._master_id,
                                      detail={"added": added, "removed": removed}))
        logger.info("epoch %s of %s/%s: +%s -%s", record.epoch, record.tenant, record.dataset, added, removed,
                    extra={"tenant_id": record.tenant, "epoch_id": record.epoch})

    def _retire_failed(self) -> None:
        """Take replicas whose load FAILED off their epochs (the reason kept), so this pass
        places them on other workers."""
        for record in self._state.records_named("failed_replicas"):
            if retire_failed_replicas(record) is None:
                continue
            updated = self._state.update_record(record.tenant, record.dataset, record.epoch,
                                                lambda current: retire_failed_replicas(current))
            if updated is None:
                continue
            for worker in sorted(set(updated.load_failures) - set(record.load_failures)):
                reason = updated.load_failures[worker]
                self._audit.record(AuditEvent(
                    kind="replica.FAILED", tenant=record.tenant, dataset=record.dataset, epoch=record.epoch,
                    master_id=self._master_id,
                    detail={"worker": worker, "reason": reason, "failures": len(updated.load_failures),
                            "max_load_failures": self._config.global_config.max_load_failures}))
                logger.warning("epoch %s of %s/%s failed to load on %s (%s): placing it elsewhere",
                               record.epoch, record.tenant, record.dataset, worker, reason,
                               extra={"tenant_id": record.tenant, "worker_id": worker, "epoch_id": record.epoch})

    def _fail_if_unplaceable(self, record: AssignmentRecord, max_failures: int) -> None:
        if failed_everywhere(record, max_failures) is None:
            return
        updated = self._state.update_record(record.tenant, record.dataset, record.epoch,
                                            lambda current: failed_everywhere(current, max_failures))
        if updated is None or updated.status != FAILED:
            return
        self._audit.record(AuditEvent(kind="admission.FAILED", tenant=record.tenant, dataset=record.dataset,
                                      epoch=record.epoch, master_id=self._master_id,
                                      detail={"reason": updated.message,
                                              "load_failures": dict(updated.load_failures)}))
        logger.error("epoch %s of %s/%s FAILED: %s", record.epoch, record.tenant, record.dataset, updated.message,
                     extra={"tenant_id": record.tenant, "epoch_id": record.epoch})

    def _roll_up_shards(self) -> None:
        """Sharded epochs follow their shards (ASSIGNED, READY, FAILED); shards follow an epoch
        that FAILED or was EVICTED (`sharded_epochs`)."""
        records = self._state.records_named("sharded")  # sharded epochs and their shards
        by_key = {(r.tenant, r.dataset, r.epoch): r for r in records}
        now_ms = int(time.time() * 1000)
        for epoch in (r for r in records if r.sharded):
            shards = {s: by_key[(epoch.tenant, epoch.dataset, s)] for s in epoch.shards
                      if (epoch.tenant, epoch.dataset, s) in by_key}
            if rolled_up(epoch, shards, now_ms) is None:
                continue
            updated = self._state.update_record(epoch.tenant, epoch.dataset, epoch.epoch,
                                                partial(rolled_up, shards=shards, now_ms=now_ms))
            if updated is not None and updated.status != epoch.status:
                self._audit.record(AuditEvent(kind=f"admission.{updated.status}", tenant=epoch.tenant,
                                              dataset=epoch.dataset, epoch=epoch.epoch, master_id=self._master_id,
                                              detail={"shards": list(epoch.shards), "reason": updated.message}))
                log = logger.error if updated.status == FAILED else logger.info
                log("sharded epoch %s of %s/%s is %s %s", epoch.epoch, epoch.tenant, epoch.dataset, updated.status,
                    updated.message, extra={"tenant_id": epoch.tenant, "epoch_id": epoch.epoch})
            by_key[(epoch.tenant, epoch.dataset, epoch.epoch)] = updated or epoch
        for shard in (r for r in records if r.shard_of):
            parent = by_key.get((shard.tenant, shard.dataset, shard.shard_of))
            if cascaded(shard, parent) is not None:
                self._state.update_record(shard.tenant, shard.dataset, shard.epoch,
                                          partial(cascaded, epoch=parent))

    def _retire_leaving(self, record: AssignmentRecord, live: set[tuple[str, str]]) -> None:
        """Drop leaving replicas once their replacements are READY (or the worker is gone)."""
        def change(current: AssignmentRecord) -> AssignmentRecord | None:
            staying = [r for r in current.replicas.values() if not r.leaving]
            done = sum(r.state in (R_READY, R_FAILED) for r in staying) >= len(staying)
            replicas = {w: r for w, r in current.replicas.items()
                        if not r.leaving or (not done and (current.tenant, w) in live)}
            return replace(current, replicas=replicas) if replicas != current.replicas else None

        self._state.update_record(record.tenant, record.dataset, record.epoch, change)

    def sync(self, session: WorkerSession, index: DesiredEpochs | None = None) -> None:
        """Send `session` the plans it should hold and has not got; drop what it should not hold.
        `index`: what every worker should hold, when a pass syncs them all (else computed here)."""
        if session.closed:
            return
        session.reported = False  # before `held` is read: a report from now on is synced by the next pass
        if index is None:  # one worker (connecting): its epochs from the index, not a sort of every record
            index = DesiredEpochs({session.key: self._state.desired_of(session.key)}, self._state.superseded())
        old = index.superseded
        # Oldest first: a worker loading several epochs of a dataset has each base before its increments.
        desired = index.of_worker(session.key)
        for ref, record in desired.items():
            replica = record.replicas[session.worker_id]
            if ref in session.sent or ref in session.held or replica.state == R_FAILED:
                continue
            if (record.tenant, record.dataset, record.epoch) in old:
                continue  # superseded and not held here (a restarted worker): not worth loading again
            plan = self._state.get_plan(record.tenant, record.dataset, record.epoch)
            if plan is None:
                logger.error("epoch %s has no plan at %s", record.epoch,
                             self._state.keys.plan(record.tenant, record.dataset, record.epoch))
                continue
            session.sent.add(ref)
            session.send(data_assignment=_assignment(record, plan))
        for ref in sorted((set(session.held) | session.sent) - set(desired)):
            dataset, _, epoch = ref.partition("/")
            session.held.pop(ref, None)
            session.sent.discard(ref)
            session.send(data_unassignment=_unassignment(dataset, epoch))


def _evicted(record: AssignmentRecord, why: Eviction) -> AssignmentRecord | None:
    """`record` EVICTED for `why` (None: it is no longer live, nothing to evict)."""
    if not record.live:
        return None
    return replace(record, status=EVICTED, replicas={}, message=f"evicted ({why.reason}): {why.detail}")


def _assignment(record: AssignmentRecord, plan):
    from speedlayer.api.v1 import control_plane_service_pb2 as cp

    return cp.DataAssignmentEvent(dataset_id=record.dataset, epoch_id=record.epoch, load_plan=plan)


def _unassignment(dataset: str, epoch: str):
    from speedlayer.api.v1 import control_plane_service_pb2 as cp

    return cp.DataUnassignmentEvent(dataset_id=dataset, epoch_id=epoch, reason="placed elsewhere")
