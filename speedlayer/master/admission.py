"""The Admission Controller (seed §6): validate, resolve into a LoadPlan, check quotas, persist,
assign. Every transition goes to the audit trail.

Idempotency: an epoch's id is derived from the tenant, the dataset, the source table, the
partitions asked for and the table version it resolved to, so the same request on the same
table version names the same epoch on any master. A caller's `request_id` (idempotency key) is
remembered under `/requests/{tenant}/{request_id}`: a retry with it returns that epoch even
if the table moved on. A record left PENDING or PLANNED by a leader that died is resumed.
The same table version admitted again with an explicit `replication` changes that epoch's
(`master.replication`): the way out of "1 of 2 replicas placed" with one worker.

An epoch estimated above what one worker should hold is sharded (`master.sharding`): its shard
records and their plans (each a subset of the files) are written before the epoch's own record,
which then names them; each shard is assigned like an epoch, and the reconciler keeps the epoch's
status rolled up from its shards (`master.sharded_epochs`). A sharded epoch is never incremental.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from typing import Callable, Iterator

from speedlayer.api.v1 import control_plane_service_pb2 as cp
from speedlayer.api.v1 import management_service_pb2 as mg
from speedlayer.errors import (
    InvalidRequestError, NotFoundError, TenantIsolationError, UnsupportedSourceError,
)
from speedlayer.keys import valid_id
from speedlayer.master.admission_hooks import NO_HOOKS, AdmissionHooks
from speedlayer.master.placement import select_evenly
from speedlayer.master.quotas import check_usage, footprint
from speedlayer.master.replication import shortfall, with_replication
from speedlayer.master.sharded_epochs import rolled_up, shard_id, shard_note
from speedlayer.master.sharding import ShardPlan, plan_shards, shard_limit, source_files, with_files
from speedlayer.master.state import ClusterState, ConfigView
from speedlayer.master.strategies import AssignmentStrategy, Candidate, PlanSummary, eligible
from speedlayer.master.tail_admission import admit_tail, plan_tail, validate_tail
from speedlayer.observability.audit import AuditEvent, AuditLogger
from speedlayer.observability.metrics import ADMISSIONS, ASSIGNMENT_DURATION
from speedlayer.records import (
    ASSIGNED, EVICTED, FAILED, PENDING, PLANNED, AssignmentRecord, DatasetSpec, ReplicaRecord,
)
from speedlayer.sources import PartitionFilter, ResolvedTable, TableSource, source_kind
from speedlayer.sources.delta_changes import TableChange, incremental_source
from speedlayer.sources.delta_offsets import DeltaOffsets
from speedlayer.tail_spec import TailSpec

logger = logging.getLogger(__name__)

MAX_REPLICATION = 16


def _digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _assigned_to(record: AssignmentRecord, workers: list[str]) -> AssignmentRecord | None:
    """A PLANNED `record` ASSIGNED to `workers` (None: not PLANNED, or no worker chosen)."""
    if record.status != PLANNED or not workers:
        return None
    return replace(record, status=ASSIGNED, replicas={w: ReplicaRecord() for w in workers})


def epoch_id(tenant: str, dataset: str, resolved: ResolvedTable, wanted: PartitionFilter) -> str:
    """Deterministic: the same table version asked for the same way names the same epoch
    (whether an admission or the refresh of a followed dataset planned it)."""
    return f"v{resolved.version}-{_digest(tenant, dataset, resolved.identity, wanted, resolved.version)[:12]}"


def partition_filter(request: mg.AdmitDatasetRequest) -> PartitionFilter:
    wanted = []
    for index, spec in enumerate(request.partitions_to_load):
        if not spec.values:
            raise InvalidRequestError(f"partitions_to_load[{index}] is empty: give column -> value pairs")
        wanted.append(dict(spec.values))
    return wanted


def validate(request: mg.AdmitDatasetRequest) -> None:
    for name in ("tenant_id", "dataset_id"):
        if not valid_id(getattr(request, name)):
            raise InvalidRequestError(
                f"{name}={getattr(request, name)!r}: expected 1-128 of letters, digits, '_', '.', '-'"
            )
    if request.request_id and not valid_id(request.request_id):
        raise InvalidRequestError(f"request_id={request.request_id!r}: expected 1-128 of letters, digits, '_', '.', '-'")
    if not 0 <= request.replication <= MAX_REPLICATION:
        raise InvalidRequestError(f"replication={request.replication}: expected 0 (default) to {MAX_REPLICATION}")
    kind = source_kind(request.source)
    if kind == "olap_table":
        raise UnsupportedSourceError("the OLAP (StarRocks) source of seed 002 is not implemented; "
                                     "admit a delta_table or an iceberg_table")
    if kind == "delta_table" and not request.source.delta_table.table_uri:
        raise InvalidRequestError("source.delta_table.table_uri is empty")
    if kind == "iceberg_table":
        table = request.source.iceberg_table
        if not (table.catalog and table.database and table.table):
            raise InvalidRequestError("source.iceberg_table needs catalog, database and table")
    validate_tail(request)


class AdmissionController:
    """`admit(request)` -> AdmitDatasetResponse; raises SpeedLayerError subclasses.

    `hooks` act at the named steps of an admission (`AdmissionHooks`; nothing by default, the
    failover tests' entry point passes its own)."""

    def __init__(self, state: ClusterState, config: ConfigView, table_sources: dict[str, TableSource],
                 strategy: Callable[[], AssignmentStrategy], candidates: Callable[[str], list[Candidate]],
                 audit: AuditLogger, master_id: str, placed: Callable[[], None],
                 followed: Callable[[str, str], None] = lambda tenant, dataset: None,
                 hooks: AdmissionHooks = NO_HOOKS, offsets: DeltaOffsets | None = None) -> None:
        self._state, self._config, self._table_sources = state, config, table_sources
        self._strategy, self._candidates = strategy, candidates
        self._audit, self._master_id, self._placed = audit, master_id, placed
        self._followed, self._hooks = followed, hooks
        self._offsets = offsets if offsets is not None else DeltaOffsets()
        # A tail being admitted, until its dataset spec (which plans read it from) is written.
        self._admitting_tails: dict[tuple[str, str], TailSpec] = {}

    def admit(self, request: mg.AdmitDatasetRequest) -> mg.AdmitDatasetResponse:
        started = time.perf_counter()
        try:
            response = self._admit(request)
        except Exception:
            ADMISSIONS.labels(outcome="refused").inc()
            raise
        ADMISSIONS.labels(outcome=response.status).inc()
        if response.status == ASSIGNED:
            ASSIGNMENT_DURATION.observe(time.perf_counter() - started)
        return response

    def _admit(self, request: mg.AdmitDatasetRequest) -> mg.AdmitDatasetResponse:
        validate(request)
        tenant, dataset = request.tenant_id, request.dataset_id
        self._config.read_tenant(tenant)
        wanted = partition_filter(request)
        if request.request_id:
            known = self._state.metadata.get(self._state.keys.request(tenant, request.request_id))
            record = self._state.record(tenant, dataset, known.decode()) if known else None
            if record is not None and record.status != PENDING:
                return self._continue(record, None)
        kind = source_kind(request.source)
        table_source = self._table_sources.get(kind)
        if table_source is None:
            raise UnsupportedSourceError(f"no {kind} source is configured on this master")
        self._check_roots(tenant, request.source)
        resolved = table_source.resolve(request.source, wanted)
        tail = (admit_tail(request, self._config.tenant(tenant), resolved, self._offsets)
                if request.HasField("tail") else None)
        epoch = epoch_id(tenant, dataset, resolved, wanted)
        request_id = request.request_id or _digest(tenant, dataset, resolved.identity, wanted, resolved.version)[:20]
        # The request id, the plan and the spec go with the record's own writes (one etcd
        # transaction each: created, PLANNED, ASSIGNED), not a round trip each.
        request_write = ((self._state.keys.request(tenant, request_id), epoch.encode()),)
        existing = self._state.record(tenant, dataset, epoch)
        if existing is None or existing.status == EVICTED:
            replication = request.replication or self._default_replication(tenant)
            existing = self._create(tenant, dataset, resolved, epoch, request_id, replication, also=request_write)
        else:
            if request.replication and existing.live and existing.replication != request.replication:
                existing = self._replicate(existing, request.replication)
            self._state.put_all(request_write)
        follows = kind == "delta_table" and not request.source.delta_table.pin_version
        spec = DatasetSpec("delta", resolved.source.delta.table_uri, tuple(wanted), request.replication,
                           tail=tail.to_json() if tail is not None else "")
        new_spec = follows and self._config.spec(tenant, dataset) != spec  # the watched specs: no etcd read
        spec_write = ((self._state.keys.dataset_spec(tenant, dataset), spec.to_json()),) if new_spec else ()
        if tail is not None:
            self._admitting_tails[(tenant, dataset)] = tail
        try:
            with self._placing(existing):
                response = self._continue(existing, resolved, also=spec_write)
        finally:
            self._admitting_tails.pop((tenant, dataset), None)
        if follows:
            self._followed_now(tenant, dataset, spec, new_spec)
        return response

    def _default_replication(self, tenant: str) -> int:
        return self._config.tenant(tenant).replication_factor or self._config.global_config.replication_factor

    def _followed_now(self, tenant: str, dataset: str, spec: DatasetSpec, written: bool) -> None:
        """The dataset now follows the table (`spec`, `written` with the admission's record if it
        is new): every new version becomes an epoch (master.refresh)."""
        if written:
            self._config.wrote_spec(tenant, dataset, spec)
            self._audit.record(AuditEvent(kind="dataset.follow", tenant=tenant, dataset=dataset,
                                          master_id=self._master_id,
                                          detail={"table_uri": spec.source_uri, "partitions": list(spec.partitions)}))
        self._followed(tenant, dataset)

    def plan_refresh(self, tenant: str, dataset: str, spec: DatasetSpec, resolved: ResolvedTable,
                     base: AssignmentRecord | None, change: TableChange | None,
                     detail: dict) -> AssignmentRecord:
        """A new epoch of a followed dataset: incremental on `base` (`change` incremental), else
        a full rebuild; placed on the base's workers first (they hold what it adds to). Raises
        PreconditionError (quotas) before anything is persisted."""
        wanted = [dict(p) for p in spec.partitions]
        epoch = epoch_id(tenant, dataset, resolved, wanted)
        existing = self._state.record(tenant, dataset, epoch)
        if existing is not None and existing.status != EVICTED:
            return existing
        # (base, change) when the new epoch is an increment on `base`, else None.
        increment = ((base, change) if base is not None and change is not None and change.incremental
                     and not base.sharded and not self._shard_plans(tenant, dataset, epoch, resolved) else None)
        base_epoch = increment[0].epoch if increment is not None else ""
        request_id = _digest(tenant, dataset, resolved.identity, wanted, resolved.version)[:20]
        record = self._create(tenant, dataset, resolved, epoch, request_id,
                              spec.replication or self._default_replication(tenant),
                              base=increment[0] if increment is not None else None, audit_detail=detail)
        if record.status != PENDING:
            return record
        source = incremental_source(resolved, increment[1]) if increment is not None else None
        with self._placing(record):
            record = self._plan(record, resolved, source=source, base_epoch=base_epoch)
            return self._assign(record, preferred=base.staying() if base is not None else ())

    @contextmanager
    def _placing(self, record: AssignmentRecord) -> Iterator[None]:
        """The reconciler leaves `record` (and its shards) to this admission meanwhile
        (`ClusterState.placing`), and is woken after it: whatever the admission left unplaced
        (no room, an error) is the reconciler's again."""
        refs = [(record.tenant, record.dataset, e) for e in (record.epoch, *record.shards)]
        try:
            with self._state.placing(refs):
                yield
        finally:
            self._placed()

    def _replicate(self, record: AssignmentRecord, replication: int) -> AssignmentRecord:
        """The same epoch admitted again with another explicit replication: it now wants that many
        replicas (the reconciler places more, or drops the extra ones)."""
        workers = len(self._candidates(record.tenant))

        def change(current: AssignmentRecord) -> AssignmentRecord | None:
            if not current.live or current.replication == replication:
                return None
            updated = with_replication(current, replication)
            return replace(updated, message=shortfall(updated, workers))

        updated = self._state.update_record(record.tenant, record.dataset, record.epoch, change)
        if updated is None:
            return record
        if updated.replication == replication != record.replication:
            self._audit.record(AuditEvent(kind="admission.replication", tenant=record.tenant, dataset=record.dataset,
                                          epoch=record.epoch, master_id=self._master_id,
                                          detail={"from": record.replication, "to": replication}))
            self._placed()
        return updated

    def _check_roots(self, tenant: str, source: mg.DataSourceIdentifier) -> None:
        roots = self._config.tenant(tenant).source_roots
        if not roots or source_kind(source) != "delta_table":
            return
        from speedlayer.sources.delta import normalize_table_uri

        uri = normalize_table_uri(source.delta_table.table_uri)
        if not any(uri == r.rstrip("/") or uri.startswith(r.rstrip("/") + "/") for r in roots):
            raise TenantIsolationError(f"tenant {tenant} may not admit {uri}: outside its source roots {list(roots)}")

    def _create(self, tenant: str, dataset: str, resolved: ResolvedTable, epoch: str, request_id: str,
                replication: int, base: AssignmentRecord | None = None,
                audit_detail: dict | None = None, also: tuple[tuple[str, bytes], ...] = ()) -> AssignmentRecord:
        global_config, tenant_config = self._config.global_config, self._config.tenant(tenant)
        estimate = int(resolved.total_bytes * global_config.memory_expansion_factor)
        record = AssignmentRecord(
            tenant=tenant, dataset=dataset, epoch=epoch, request_id=request_id, status=PENDING,
            version=resolved.version, total_rows=resolved.total_rows, file_count=resolved.file_count,
            estimated_memory_bytes=estimate, replication=replication,
            base_epoch=base.epoch if base is not None else "", kind="incremental" if base is not None else "full",
        )
        shards = self._shard_plans(tenant, dataset, epoch, resolved) if base is None else []
        if shards:
            record = replace(record, shards=tuple(shard_id(epoch, i) for i in range(len(shards))))
        # The records this creation may replace, and the usage the leader keeps per change: no
        # scan of every record per admission (O(epochs): 2,000 at scale).
        by_epoch = {(tenant, dataset, e): r for e in (epoch, *record.shards)
                    if (r := self._state.record(tenant, dataset, e)) is not None}
        check_usage(*self._state.usage(tenant), tenant, tenant_config, global_config, footprint(record, base))
        for index, shard in enumerate(shards):  # before the epoch names them: never a dangling shard id
            self._create_shard(record, index, shard, resolved, by_epoch)
        created = None
        if (tenant, dataset, epoch) in by_epoch and by_epoch[(tenant, dataset, epoch)].status == EVICTED:
            # Admitted again; None if the reconciler deleted the record since (its retention over).
            created = self._state.update_record(tenant, dataset, epoch, lambda r: record, also=also)
        if created is None:
            created = self._state.create_record(record, also=also)
        if created.status == PENDING and created.request_id == request_id:
            self._audit_status(created, {"request_id": request_id, "files": resolved.file_count,
                                         "estimated_bytes": estimate, "kind": record.kind,
                                         "base_epoch": record.base_epoch, "shards": list(record.shards),
                                         **(audit_detail or {})})
        return created

    def _shard_plans(self, tenant: str, dataset: str, epoch: str, resolved: ResolvedTable) -> list[ShardPlan]:
        """The shards of a full epoch of `resolved` ([]: it fits one worker); PreconditionError
        when it would need more shards than the tenant has workers."""
        estimate = int(resolved.total_bytes * self._config.global_config.memory_expansion_factor)
        workers = self._candidates(tenant)
        limit = shard_limit(self._config.tenant(tenant).shard_max_bytes, [c.memory_bytes for c in workers])
        return plan_shards(source_files(resolved.source), resolved.partition_columns, estimate, limit,
                           len(workers), f"epoch {epoch} of {tenant}/{dataset}")

    def _create_shard(self, epoch: AssignmentRecord, index: int, shard: ShardPlan, resolved: ResolvedTable,
                      by_epoch: dict[tuple[str, str, str], AssignmentRecord]) -> None:
        """Shard `index` of `epoch`: its plan, then its record (PENDING), placed like an epoch's."""
        record = replace(epoch, epoch=shard_id(epoch.epoch, index), total_rows=shard.rows,
                         file_count=len(shard.files), estimated_memory_bytes=shard.estimated_bytes, kind="shard",
                         shards=(), shard_of=epoch.epoch, shard_values=shard.values)
        self._state.put_plan(self._load_plan(record, resolved, with_files(resolved.source, shard.files)))
        existing = by_epoch.get((record.tenant, record.dataset, record.epoch))
        if existing is not None and existing.status == EVICTED:
            self._state.update_record(record.tenant, record.dataset, record.epoch, lambda r: record)
        else:
            self._state.create_record(record)

    def _continue(self, record: AssignmentRecord, resolved: ResolvedTable | None,
                  also: tuple[tuple[str, bytes], ...] = ()) -> mg.AdmitDatasetResponse:
        """Drive `record` on from wherever it stands (a retry may find it half done). `also`:
        keys written with its assignment (on their own if it needs none)."""
        if record.status == PENDING:
            if resolved is None:
                raise NotFoundError(f"epoch {record.epoch} is PENDING and its request must be sent "
                                    "again with its source to be planned")
            record = self._plan(record, resolved)
        if record.status == PLANNED:
            record = self._assign(record, also=also)
        else:
            self._state.put_all(also)
        return mg.AdmitDatasetResponse(epoch_id=record.epoch, message=record.message, status=record.status,
                                       request_id=record.request_id)

    @staticmethod
    def _load_plan(record: AssignmentRecord, resolved: ResolvedTable, source: cp.DataSource,
                   base_epoch: str = "", tail: str = "") -> cp.LoadPlan:
        return cp.LoadPlan(tail=tail,
            plan_id=f"{record.tenant}/{record.dataset}/{record.epoch}", source=source,
            base_epoch_id=base_epoch, version=resolved.version,
            destination_table_name=f"{record.dataset}__{record.epoch}".replace("-", "_").replace(".", "_"),
            arrow_schema=resolved.arrow_schema, tenant_id=record.tenant, dataset_id=record.dataset,
            epoch_id=record.epoch, estimated_memory_bytes=record.estimated_memory_bytes,
            total_rows=record.total_rows, partition_columns=resolved.partition_columns,
        )

    def _plan(self, record: AssignmentRecord, resolved: ResolvedTable, source: cp.DataSource | None = None,
              base_epoch: str = "") -> AssignmentRecord:
        to_plan = [r for r in map(lambda s: self._state.record(record.tenant, record.dataset, s), record.shards)
                   if r is not None]  # a sharded epoch's plans are its shards', written with their records
        plan_write = () if record.sharded else (  # written with the record's PLANNED, never after it
            self._state.plan_write(self._load_plan(record, resolved, source or resolved.source, base_epoch,
                                                   plan_tail(record, resolved, self._admitting_tails,
                                                             self._config.spec, self._offsets))),)
        for target in [*to_plan, record]:
            updated = self._state.update_existing(target.tenant, target.dataset, target.epoch,
                                                  lambda r: replace(r, status=PLANNED) if r.status == PENDING else None,
                                                  also=plan_write if target is record else ())
            self._audit_status(updated, {"plan_id": f"{target.tenant}/{target.dataset}/{target.epoch}"})
        self._hooks.after_planned(updated)
        return updated

    def _assign(self, record: AssignmentRecord, preferred: tuple[str, ...] = (),
                also: tuple[tuple[str, bytes], ...] = ()) -> AssignmentRecord:
        if record.sharded:
            assigned = self._assign_shards(record)
            self._state.put_all(also)
            return assigned
        base = self._state.record(record.tenant, record.dataset, record.base_epoch) if record.base_epoch else None
        share = footprint(record, base) // max(1, record.replication)  # an increment needs room for what it adds
        summary = PlanSummary(record.tenant, record.dataset, record.epoch, share)
        candidates = self._candidates(record.tenant)
        usable = {c.worker_id for c in eligible(summary, candidates)}
        chosen = [w for w in preferred if w in usable][:record.replication]
        if len(chosen) < record.replication:
            chosen += select_evenly(self._strategy(), summary, candidates, record.replication - len(chosen),
                                    exclude=set(chosen))

        def assign(current: AssignmentRecord) -> AssignmentRecord | None:
            if current.status != PLANNED:
                return None
            placed = (replace(current, status=ASSIGNED, replicas={w: ReplicaRecord() for w in chosen})
                      if chosen else current)
            free = {c.worker_id: c.free_bytes for c in candidates if c.memory_bytes > 0 and not c.draining}
            return replace(placed, message=shortfall(placed, len(candidates), free))

        updated = self._state.update_existing(record.tenant, record.dataset, record.epoch, assign, also=also)
        if updated.status == ASSIGNED:
            self._audit_status(updated, {"workers": sorted(updated.replicas)})
            self._placed()
        return updated

    def _assign_shards(self, record: AssignmentRecord) -> AssignmentRecord:
        """Each shard on `replication` workers with room for it, the memory of the shards placed
        so far counted, so that they spread; a shard without room stays PLANNED for the
        reconciler, and `status` says what it needs against what is free."""
        candidates = self._candidates(record.tenant)
        shards: dict[str, AssignmentRecord] = {}
        for shard_epoch in record.shards:
            shard = self._state.record(record.tenant, record.dataset, shard_epoch)
            if shard is None:
                continue
            if shard.status == PLANNED:
                summary = PlanSummary(shard.tenant, shard.dataset, shard.epoch, shard.estimated_memory_bytes)
                chosen = self._strategy().select(summary, candidates, shard.replication)
                candidates = [replace(c, assigned_bytes=c.assigned_bytes + shard.estimated_memory_bytes,
                                      epoch_count=c.epoch_count + 1) if c.worker_id in chosen else c
                              for c in candidates]
                shard = self._state.update_record(shard.tenant, shard.dataset, shard.epoch,
                                                  partial(_assigned_to, workers=chosen)) or shard
                if shard.status == ASSIGNED:
                    self._audit_status(shard, {"workers": sorted(shard.replicas), "shard_of": record.epoch})
            shards[shard_epoch] = shard
        updated = self._state.update_record(record.tenant, record.dataset, record.epoch,
                                            lambda r: rolled_up(r, shards, int(time.time() * 1000))) or record
        if updated.status == ASSIGNED:
            self._audit_status(updated, {"shards": {s: sorted(r.replicas) for s, r in shards.items()}})
        self._placed()
        free = {c.worker_id: c.free_bytes for c in candidates if c.memory_bytes > 0 and not c.draining}
        notes = {s: shortfall(r, len(candidates), free) for s, r in shards.items()}
        return replace(updated, message=shard_note(updated, list(shards.values()), notes))

    def fail(self, record: AssignmentRecord, why: str) -> None:
        updated = self._state.update_record(record.tenant, record.dataset, record.epoch,
                                            lambda r: replace(r, status=FAILED, message=why))
        if updated is not None:
            self._audit_status(updated, {"reason": why})

    def _audit_status(self, record: AssignmentRecord, detail: dict) -> None:
        self._audit.record(AuditEvent(kind=f"admission.{record.status}", tenant=record.tenant,
                                      dataset=record.dataset, epoch=record.epoch,
                                      master_id=self._master_id, detail=detail))
        logger.info("epoch %s of %s/%s is %s", record.epoch, record.tenant, record.dataset, record.status,
                    extra={"tenant_id": record.tenant, "dataset_id": record.dataset, "epoch_id": record.epoch})
