"""A master: membership, election, the gRPC services, and the leader's runtime (its process
wiring is `master.process`).

Every master registers `/masters/{id}` (leased) and campaigns for `/election/master`. The
leader builds a `LeaderRuntime` (cluster state loaded from etcd, worker directory, admission,
reconciler); when deposed it drops it and closes its workers' streams, so they reconnect to
the new leader. Followers serve reads and answer everything else UNAVAILABLE naming the leader.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import cast
from concurrent import futures

import grpc

from danube_core.election import LeaseElection
from danube_core.errors import DanubeError
from danube_core.metadata import Lease, MetadataStore

from speedlayer.api.v1 import control_plane_service_pb2_grpc as cp_grpc
from speedlayer.api.v1 import management_service_pb2_grpc as mg_grpc
from speedlayer.config import MasterConfig
from speedlayer.errors import NotLeaderError
from speedlayer.keys import SpeedLayerKeys
from speedlayer.master.admission import AdmissionController
from speedlayer.master.admission_hooks import NO_HOOKS, AdmissionHooks
from speedlayer.master.control_plane import ControlPlaneServicer
from speedlayer.master.management import ManagementServicer
from speedlayer.master.reconciler import Reconciler, candidates_from
from speedlayer.master.refresh import Refresher
from speedlayer.master.state import ClusterState, ConfigView
from speedlayer.master.strategies import AssignmentStrategy, strategy_named
from speedlayer.master.table_cache import VersionCachedDeltaSource
from speedlayer.master.worker_leases import LeaseRefresher
from speedlayer.master.worker_streams import StreamRegistry
from speedlayer.master.workers import WorkerDirectory
from speedlayer.observability.audit import AuditEvent, AuditLogger, JsonlAuditLogger
from speedlayer.observability.metrics import LEADER_STATUS, TimedMetadataStore, forget_leader_view, serve_metrics
from speedlayer.protocol.master_rpc import MASTER_SERVER_OPTIONS, MAX_RECONNECT_BACKOFF_S
from speedlayer.sources import TableSource

logger = logging.getLogger(__name__)

# A worker's EventStream holds one of the server's threads for as long as it is connected, so
# the pool must outnumber the workers or the rest (and every management call) wait for a
# thread that never frees (it was 64: a 65th worker could not register). Threads start only when used.
GRPC_THREADS = 2048



class LeaderRuntime:
    """Everything only the leader runs; built on election, dropped on deposition."""

    def __init__(self, server: "MasterServer") -> None:
        self.registry = StreamRegistry()
        self.state = ClusterState(server.metadata, server.keys, self._changed)
        grace = (3 * server.config.heartbeat_interval_seconds + server.config.election_ttl_seconds
                 + MAX_RECONNECT_BACKOFF_S)
        self.reconciler = Reconciler(self.state, self.registry, server.config_view, server.strategy,
                                     server.audit, server.config.master_id, takeover_grace_s=grace)
        self.leases = LeaseRefresher(server.metadata)
        self.directory = WorkerDirectory(self.state, self.registry, server.config.master_id,
                                         server.config.heartbeat_interval_seconds, self._changed, self.leases)
        self.admission = AdmissionController(
            self.state, server.config_view, server.table_sources, server.strategy,
            self._candidates,
            server.audit, server.config.master_id, self._changed,
            followed=lambda tenant, dataset: self.refresher.look_at(tenant, dataset, "admitted"),
            hooks=server.hooks)
        self.refresher = Refresher(self.state, server.config_view, server.delta_source,
                                   self.admission, server.audit, server.config.master_id,
                                   make_room=self.reconciler.make_room)

    def _changed(self) -> None:
        self.reconciler.wake()
        refresher = getattr(self, "refresher", None)
        if refresher is not None:
            refresher.wake()

    def _candidates(self, tenant: str):
        loads = self.state.worker_loads()  # kept per record change: no scan of the records per admission
        _, _, _, draining = self.state.snapshot()
        workers = self.state.placeable_workers(time.monotonic() < self.reconciler.takeover_end())
        return [c for c in candidates_from(loads, self.registry.all(), workers, draining) if c.tenant == tenant]

    def start(self) -> None:
        self.state.load()
        self.leases.start()
        self.reconciler.start()
        self.refresher.start()

    def stop(self) -> None:
        self.refresher.stop()
        self.reconciler.stop()
        self.leases.stop()
        self.registry.close_all()
        self.state.close()


class MasterServer:
    def __init__(self, config: MasterConfig, audit: AuditLogger | None = None,
                 hooks: AdmissionHooks = NO_HOOKS) -> None:
        self.config = config
        self.hooks = hooks  # what the leader's admissions do at their named steps (nothing, unless a test says)
        self.keys = SpeedLayerKeys(config.key_root)
        self.audit = audit or JsonlAuditLogger(config.audit_log or f"speedlayer-audit-{config.master_id}.jsonl")
        self._store = config.etcd.connect()  # TLS, user and password from the `etcd:` section
        # A proxy, not a subclass: it forwards every attribute to the store (timing the data
        # operations), so it is used as the MetadataStore it wraps.
        self.metadata = cast(MetadataStore, TimedMetadataStore(self._store))
        self.config_view = ConfigView(self.metadata, self.keys, self._config_changed)
        self.delta_source = VersionCachedDeltaSource(config.delta_storage_options)  # the refresher's too
        self.table_sources: dict[str, TableSource] = {"delta_table": self.delta_source}
        if config.iceberg_catalogs:
            from speedlayer.sources.iceberg import IcebergTableSource

            self.table_sources["iceberg_table"] = IcebergTableSource(config.iceberg_catalogs)
        self._strategy_name = ""
        self._strategy: AssignmentStrategy | None = None
        self._lock = threading.Lock()
        self._runtime: LeaderRuntime | None = None
        self._member_lease: Lease | None = None
        self._stopped = threading.Event()
        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=GRPC_THREADS, thread_name_prefix="grpc"),
                                 options=MASTER_SERVER_OPTIONS)
        cp_grpc.add_ControlPlaneServiceServicer_to_server(ControlPlaneServicer(self._stream_leader), self._grpc)
        mg_grpc.add_ManagementServiceServicer_to_server(
            ManagementServicer(self.metadata, self.keys, lambda: self.leader().admission), self._grpc)
        self.election = LeaseElection(self.metadata, self.keys.election, config.master_id.encode(),
                                      ttl_s=config.election_ttl_seconds,
                                      check_interval_s=max(0.2, config.election_ttl_seconds / 5),
                                      on_elected=self._elected, on_deposed=self._deposed)

    def strategy(self) -> AssignmentStrategy:
        name = self.config_view.global_config.strategy
        with self._lock:
            if self._strategy is None or name != self._strategy_name:
                self._strategy, self._strategy_name = strategy_named(name), name
            return self._strategy

    def start(self) -> None:
        self.config_view.start()
        self._register_member()
        self._grpc.add_insecure_port(self.config.address)
        self._grpc.start()
        serve_metrics(self.config.metrics_port)
        self.election.start()
        LEADER_STATUS.set(0)
        logger.info("master %s serving on %s", self.config.master_id, self.config.address,
                    extra={"master_id": self.config.master_id})

    def _register_member(self) -> None:
        lease = self.metadata.grant_lease(self.config.election_ttl_seconds)
        value = json.dumps({"address": self.config.address, "pid": os.getpid()}).encode()
        self.metadata.put(self.keys.master(self.config.master_id), value, lease=lease)
        self._member_lease = lease
        lease.keep_alive(on_lost=lambda exc: self._member_lost())

    def _member_lost(self) -> None:
        while not self._stopped.is_set():
            try:
                self._register_member()
                return
            except DanubeError as exc:
                logger.warning("re-registering master %s failed: %s", self.config.master_id, exc)
                self._stopped.wait(1.0)

    def _config_changed(self) -> None:
        runtime = self._runtime
        if runtime is not None:
            runtime.reconciler.wake()

    def _elected(self) -> None:
        runtime = LeaderRuntime(self)
        try:
            runtime.start()
        except DanubeError as exc:
            logger.error("master %s won the election but could not load the cluster state: %s",
                         self.config.master_id, exc)
            runtime.stop()
            return
        with self._lock:
            self._runtime = runtime
        LEADER_STATUS.set(1)
        self.audit.record(AuditEvent(kind="leader.elected", master_id=self.config.master_id))

    def _deposed(self) -> None:
        with self._lock:
            runtime, self._runtime = self._runtime, None
        LEADER_STATUS.set(0)
        if runtime is None:
            return
        runtime.stop()
        forget_leader_view()
        self.audit.record(AuditEvent(kind="leader.deposed", master_id=self.config.master_id))

    def leader(self) -> LeaderRuntime:
        runtime = self._runtime
        if runtime is not None and self.election.is_leader:
            return runtime
        raise self._not_leader()

    def _not_leader(self) -> NotLeaderError:
        try:
            raw = self.election.leader_id()
            leader_id = raw.decode() if raw else None
            address = None
            if leader_id and leader_id != self.config.master_id:
                member = self.metadata.get(self.keys.master(leader_id))
                address = json.loads(member)["address"] if member else None
        except (DanubeError, ValueError, KeyError):
            leader_id, address = None, None
        retry_ms = 100 if address else max(200, self.config.election_ttl_seconds * 200)
        return NotLeaderError(leader_id, address, retry_ms)

    def _stream_leader(self):
        runtime = self.leader()
        return runtime.directory, runtime.reconciler.sync

    def wait(self) -> None:
        self._stopped.wait()

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.election.stop()
        self._deposed()
        self._grpc.stop(grace=1.0).wait(5)
        self.config_view.stop()
        try:
            self.metadata.delete(self.keys.master(self.config.master_id))
        except DanubeError:
            pass
        self._store.close()
