"""`ManagementClient`: the ManagementService from any master, following the leader.

Given one or more master addresses, each call goes to the last known leader; a follower's
UNAVAILABLE names the leader (`leader-address`), so the client goes there after the
`retry-after-ms` hint; an unreachable master makes it try the next. Retries end at
`deadline_s`; other errors are raised as `grpc.RpcError` with the master's status code.

A connection is given `connect_timeout_s` (a closed port fails at once). A client that has
never reached a master and finds none of them reachable raises `MastersUnreachableError`
(naming each address and why) instead of retrying until `deadline_s`: a wrong `--masters`
gets its answer within the connect timeout. Once a master answered, an outage of all of them
(restarts, a failover) is retried until the deadline as before. A server without the
ManagementService (another port) raises `WrongServerError`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import grpc

from speedlayer.api.v1 import management_service_pb2 as mg
from speedlayer.api.v1 import management_service_pb2_grpc as mg_grpc
from speedlayer.errors import MASTERS_CHECK, MastersUnreachableError, WrongServerError
from speedlayer.protocol.master_rpc import (
    DEFAULT_CONNECT_TIMEOUT_S, MESSAGE_SIZE_OPTIONS, answered, connect_options, leader_hint,
)

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_CONNECT_TIMEOUT_S", "ManagementClient", "delta_request"]


TAIL_CALL_TIMEOUT_S = 60.0


class ManagementClient:
    """The ManagementService of the masters at `masters` (`host:port`, a list or comma-separated)."""

    def __init__(self, masters: str | list[str], *, deadline_s: float = 30.0, call_timeout_s: float = 10.0,
                 connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> None:
        self.masters = [m.strip() for m in (masters.split(",") if isinstance(masters, str) else masters) if m.strip()]
        if not self.masters:
            raise ValueError("masters: expected at least one host:port")
        if connect_timeout_s <= 0:
            raise ValueError(f"connect_timeout_s={connect_timeout_s}: expected > 0")
        self.deadline_s, self.call_timeout_s, self.connect_timeout_s = deadline_s, call_timeout_s, connect_timeout_s
        self._target = self.masters[0]
        self._channels: dict[str, grpc.Channel] = {}
        self._reached = False  # some master answered this client (then outages are retried)

    def _stub(self, target: str) -> mg_grpc.ManagementServiceStub:
        if target not in self._channels:
            self._channels[target] = grpc.insecure_channel(
                target, options=MESSAGE_SIZE_OPTIONS + connect_options(self.connect_timeout_s))
        return mg_grpc.ManagementServiceStub(self._channels[target])

    def call(self, method: str, request: Any) -> Any:
        deadline = time.monotonic() + self.deadline_s
        index = self.masters.index(self._target) if self._target in self.masters else 0
        unreached: dict[str, str] = {}  # this call's addresses no connection was made to, and why
        while True:
            try:
                reply = getattr(self._stub(self._target), method)(request, timeout=self.call_timeout_s)
                self._reached = True
                return reply
            except grpc.RpcError as exc:
                code = exc.code()
                if code == grpc.StatusCode.UNIMPLEMENTED and not answered(exc):
                    raise WrongServerError(self._target, "master", exc.details() or "", MASTERS_CHECK) from exc
                if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    self._reached = True
                    raise
                leader, retry_ms = leader_hint(exc)
                if code == grpc.StatusCode.UNAVAILABLE and not answered(exc):
                    unreached[self._target] = exc.details() or code.name
                    if not self._reached and set(self.masters) <= set(unreached):
                        raise MastersUnreachableError(
                            {m: unreached[m] for m in self.masters}, self.connect_timeout_s) from exc
                else:
                    self._reached = True
                if time.monotonic() + retry_ms / 1000 > deadline:
                    raise
                if leader:
                    self._target = leader
                else:
                    index = (index + 1) % len(self.masters)
                    self._target = self.masters[index]
                logger.debug("%s: %s; next try at %s in %d ms", method, exc.details(), self._target, retry_ms)
                if self._reached or self._target in unreached:  # else: a master not tried yet, at once
                    time.sleep(min(retry_ms, 2000) / 1000)

    def admit(self, request: mg.AdmitDatasetRequest) -> mg.AdmitDatasetResponse:
        """An admission; one with a tail waits up to TAIL_CALL_TIMEOUT_S per try, since the master
        checks the pipeline file in a process of its own (a Python start and the pipeline's imports)."""
        if request.HasField("tail") and self.call_timeout_s < TAIL_CALL_TIMEOUT_S:
            saved, self.call_timeout_s = self.call_timeout_s, TAIL_CALL_TIMEOUT_S
            try:
                return self.call("AdmitDataset", request)
            finally:
                self.call_timeout_s = saved
        return self.call("AdmitDataset", request)

    def status(self, tenant: str, dataset: str, epoch: str = "") -> mg.DatasetStatusResponse:
        return self.call("DatasetStatus", mg.DatasetStatusRequest(tenant_id=tenant, dataset_id=dataset, epoch_id=epoch))

    def workers(self, tenant: str = "") -> mg.ListWorkersResponse:
        return self.call("ListWorkers", mg.ListWorkersRequest(tenant_id=tenant))

    def drain(self, tenant: str, worker: str) -> mg.DrainWorkerResponse:
        return self.call("DrainWorker", mg.DrainWorkerRequest(tenant_id=tenant, worker_id=worker))

    def quota(self, tenant: str, memory_quota_bytes: int | None = None,
              source_roots: list[str] | None = None) -> mg.TenantQuotaResponse:
        request = mg.SetTenantQuotaRequest(tenant_id=tenant, memory_quota_bytes=memory_quota_bytes or 0,
                                           read_only=memory_quota_bytes is None and not source_roots,
                                           source_roots=source_roots or [])
        return self.call("SetTenantQuota", request)

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()


def delta_request(tenant: str, dataset: str, table_uri: str, *, request_id: str = "",
                  partitions: list[dict[str, str]] | None = None, replication: int = 0,
                  version: int | None = None, tail: mg.TailOptions | None = None) -> mg.AdmitDatasetRequest:
    """An AdmitDatasetRequest for a Delta table (latest version unless `version`); `tail`: serve
    the topic's tail beside each epoch (the pipeline's file as text and the worker's limits)."""
    source = mg.DataSourceIdentifier(delta_table=mg.DeltaTable(
        table_uri=table_uri, version=version or 0, pin_version=version is not None))
    request = mg.AdmitDatasetRequest(tenant_id=tenant, dataset_id=dataset, source=source, request_id=request_id,
                                     replication=replication,
                                     partitions_to_load=[mg.PartitionSpec(values=p) for p in partitions or []])
    if tail is not None:
        request.tail.CopyFrom(tail)
    return request
