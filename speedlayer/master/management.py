"""`ManagementService` (seed §9.1): admission and operations for admins and automation.

Mutations (AdmitDataset, DrainWorker, SetTenantQuota) are the leader's: a follower answers
UNAVAILABLE naming it. Reads (DatasetStatus, ListWorkers, a quota read) come straight from
etcd, so any master answers them. An epoch short of replicas has its `message` worked out as it
is read (`master.replication.shortfall`): what is missing and how to change replication. A
status for a tenant the speed layer has nothing of says so (not "no dataset").
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Callable

import grpc

from danube_core.errors import DanubeError
from danube_core.metadata import MetadataStore

from speedlayer.api.v1 import management_service_pb2 as mg
from speedlayer.api.v1 import management_service_pb2_grpc as mg_grpc
from speedlayer.errors import InvalidRequestError, NotFoundError, SpeedLayerError, unknown_tenant
from speedlayer.keys import SpeedLayerKeys, valid_id
from speedlayer.master.admission import AdmissionController
from speedlayer.master.leader_gate import abort, abort_with
from speedlayer.master.lifecycle import superseded_keys
from speedlayer.master.quotas import tenant_usage
from speedlayer.master.reconciler import candidates_of
from speedlayer.master.replication import shortfall
from speedlayer.master.sharded_epochs import shard_note
from speedlayer.records import R_FAILED, AssignmentRecord, TenantConfig, WorkerRecord

logger = logging.getLogger(__name__)


def _check_id(name: str, value: str) -> None:
    if not valid_id(value):
        raise InvalidRequestError(f"{name}={value!r}: expected 1-128 of letters, digits, '_', '.', '-'")


def _handled(method):
    def wrapper(self, request, context):
        try:
            return method(self, request, context)
        except SpeedLayerError as exc:
            abort_with(context, exc)
        except DanubeError as exc:
            abort(context, grpc.StatusCode.UNAVAILABLE if exc.retriable else grpc.StatusCode.INTERNAL, str(exc))
    wrapper.__name__ = method.__name__
    return wrapper


class ManagementServicer(mg_grpc.ManagementServiceServicer):
    """`leader()` returns the leader's AdmissionController or raises NotLeaderError."""

    def __init__(self, metadata: MetadataStore, keys: SpeedLayerKeys,
                 leader: Callable[[], AdmissionController]) -> None:
        self._metadata, self._keys, self._leader = metadata, keys, leader

    @_handled
    def AdmitDataset(self, request: mg.AdmitDatasetRequest, context) -> mg.AdmitDatasetResponse:
        return self._leader().admit(request)

    def _records(self, prefix: str) -> list[AssignmentRecord]:
        return [AssignmentRecord.from_json(raw, key) for key, raw in self._metadata.get_prefix(prefix)]

    @_handled
    def DatasetStatus(self, request: mg.DatasetStatusRequest, context) -> mg.DatasetStatusResponse:
        _check_id("tenant_id", request.tenant_id)
        _check_id("dataset_id", request.dataset_id)
        tenant = request.tenant_id
        records = every = self._records(self._keys.dataset_assignments_prefix(tenant, request.dataset_id))
        old = superseded_keys(records)  # not refilled: they wait for their eviction
        if request.epoch_id:
            records = [r for r in records if r.epoch == request.epoch_id]
        if not records:
            if not self._known_tenant(tenant):
                raise unknown_tenant(tenant, "--tenant (`admin workers` lists every tenant's workers)")
            what = f"epoch {request.epoch_id} of " if request.epoch_id else ""
            raise NotFoundError(f"no {what}dataset {request.dataset_id} for tenant {tenant}")
        workers, free = self._free_memory(tenant)
        notes = {r.epoch: "" if (r.tenant, r.dataset, r.epoch) in old else shortfall(r, workers, free)
                 for r in every}
        return mg.DatasetStatusResponse(epochs=[
            _epoch_status(r, shard_note(r, every, notes) if r.sharded else notes[r.epoch]) for r in records])

    def _free_memory(self, tenant: str) -> tuple[int, dict[str, int]]:
        """The tenant's registered workers and, of those reporting a capacity, their free memory
        (capacity less what the records place on them), as placement counts it."""
        registered = {self._keys.parse_worker(key): WorkerRecord.from_json(raw, key)
                      for key, raw in self._metadata.get_prefix(self._keys.tenant_workers_prefix(tenant))}
        draining = {k for k in registered if self._metadata.get(self._keys.drain(*k)) is not None}
        records = self._records(self._keys.tenant_assignments_prefix(tenant))
        candidates = candidates_of(records, [], registered, draining)
        return len(registered), {c.worker_id: c.free_bytes for c in candidates
                                 if c.memory_bytes > 0 and not c.draining}

    def _known_tenant(self, tenant: str) -> bool:
        """The speed layer has an epoch, a worker, a config or a followed dataset of `tenant`."""
        return any(self._metadata.get_prefix(prefix, keys_only=True) for prefix in (
            self._keys.tenant_assignments_prefix(tenant), self._keys.tenant_workers_prefix(tenant),
            self._keys.tenant_prefix(tenant)))

    @_handled
    def ListWorkers(self, request: mg.ListWorkersRequest, context) -> mg.ListWorkersResponse:
        if request.tenant_id:
            _check_id("tenant_id", request.tenant_id)
        prefix = (self._keys.tenant_workers_prefix(request.tenant_id) if request.tenant_id
                  else self._keys.workers_prefix)
        records = self._records(self._keys.tenant_assignments_prefix(request.tenant_id) if request.tenant_id
                                else self._keys.assignments_prefix)
        drains = {k for k, _ in self._metadata.get_prefix(self._keys.drain_prefix, keys_only=True)}
        workers = []
        for key, raw in self._metadata.get_prefix(prefix):
            tenant, worker = self._keys.parse_worker(key)
            record = WorkerRecord.from_json(raw, key)
            epochs = sorted(f"{r.dataset}/{r.epoch}:{r.replicas[worker].state}" for r in records
                            if r.tenant == tenant and worker in r.replicas)
            workers.append(mg.WorkerInfo(tenant_id=tenant, worker_id=worker, address=record.address,
                                         memory_bytes=record.memory_bytes, cpu_cores=record.cpu_cores,
                                         epochs=epochs, draining=self._keys.drain(tenant, worker) in drains))
        return mg.ListWorkersResponse(workers=workers)

    @_handled
    def DrainWorker(self, request: mg.DrainWorkerRequest, context) -> mg.DrainWorkerResponse:
        _check_id("tenant_id", request.tenant_id)
        _check_id("worker_id", request.worker_id)
        self._leader()
        if self._metadata.get(self._keys.worker(request.tenant_id, request.worker_id)) is None:
            raise NotFoundError(f"no live worker {request.worker_id} in tenant {request.tenant_id}")
        self._metadata.put(self._keys.drain(request.tenant_id, request.worker_id), b"1")
        return mg.DrainWorkerResponse(message=f"worker {request.worker_id} drains: its epochs move to other "
                                              "workers and its next heartbeat ack says DRAIN")

    @_handled
    def SetTenantQuota(self, request: mg.SetTenantQuotaRequest, context) -> mg.TenantQuotaResponse:
        _check_id("tenant_id", request.tenant_id)
        key = self._keys.tenant_config(request.tenant_id)
        if request.memory_quota_bytes < 0:
            raise InvalidRequestError(f"memory_quota_bytes={request.memory_quota_bytes}: expected >= 0")
        raw = self._metadata.get(key)
        config = TenantConfig.from_json(raw, key) if raw is not None else TenantConfig()
        if not request.read_only:
            self._leader()
            config = replace(config, memory_quota_bytes=request.memory_quota_bytes,
                             source_roots=tuple(request.source_roots) or config.source_roots)
            self._metadata.put(key, config.to_json())
        used = tenant_usage(self._records(self._keys.tenant_assignments_prefix(request.tenant_id)), request.tenant_id)
        return mg.TenantQuotaResponse(tenant_id=request.tenant_id, memory_quota_bytes=config.memory_quota_bytes,
                                      memory_used_bytes=used, source_roots=list(config.source_roots))


def _epoch_status(record: AssignmentRecord, shortfall_note: str = "") -> mg.EpochStatus:
    return mg.EpochStatus(
        epoch_id=record.epoch, status=record.status, message=shortfall_note or record.message, version=record.version,
        total_rows=record.total_rows, estimated_memory_bytes=record.estimated_memory_bytes,
        replication=record.replication, file_count=record.file_count, kind=record.kind,
        base_epoch_id=record.base_epoch,
        replicas=[mg.ReplicaStatus(worker_id=w, state=r.state, rows=r.rows, bytes=r.bytes, seconds=r.seconds,
                                   error=r.error, leaving=r.leaving) for w, r in sorted(record.replicas.items())]
        # workers whose load failed stay listed, FAILED with their reason, after they were replaced
        + [mg.ReplicaStatus(worker_id=w, state=R_FAILED, error=why) for w, why in sorted(record.load_failures.items())],
    )
