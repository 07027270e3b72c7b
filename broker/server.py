"""Process wiring: metadata store, storage engine, gRPC server and cluster membership.

Boot order (as Danube's, §5.5): cluster name key, namespaces `default`, `system` and the
bootstrap ones with the configured policies, the system topic root key, the gRPC server (and
the Prometheus endpoint, `broker.metrics`, when `broker.ports.prometheus` is set), then
registration, state, assignments watch, load reports and leader election. Client lookups
(topics, owners, registrations, namespaces and policies, producer and subscription records),
the membership's assignment handling and the leader's placement read a `LocalCache` that reads
its own writes and hands them watch events once applied, as Danube's LocalCache: `/cluster/`
and `/namespaces/` for the whole cluster (Danube's lookup protocol needs them), `/topics/` only
for the topics this broker serves (`broker.lookup_cache`); the leader election and storage read
etcd. Shutdown hands every topic over (reliable ones are sealed) before the registration lease
is revoked, so the leader reassigns them at once and the next owner continues after the sealed
offset.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import grpc

from broker.cluster import ClusterMembership
from broker.config import BrokerConfig
from broker.grpc_services import add_services
from broker.identity import (
    BrokerIdentity,
    DataDirLock,
    read_identity,
    resume_identity,
    write_identity,
)
from broker.leader import TopicAssigner, broker_election
from broker.lookup_cache import ServedTopicKeys, open_lookup_cache
from broker.namespaces import Namespaces
from broker.schema_service import add_schema_registry
from broker.send_front import SendFront, use_native_front
from broker.service import BrokerService
from broker.storage_engine import StorageEngine, StorageSettings
from broker.topic import random_id
from broker.topics_registry import TopicRegistry
from broker.wal import WalConfig
from broker.wal_http import WalHttpServer, parse_listen
from danube_core.cached_store import CachedMetadataStore
from danube_core.election import LeaseElection
from danube_core.errors import ConfigError
from danube_core.keys import topic_root_key
from danube_core.metadata import Lease, MetadataStore
from danube_core.records import BrokerRegistration, dump_u64
from danube_core.topics import TopicName

if TYPE_CHECKING:
    from broker.metrics import MetricsServer  # prometheus-client is imported only when a port is set
    from danube_core.embedded_etcd import EmbeddedEtcd  # imported only with `meta_store.embedded` set

logger = logging.getLogger(__name__)

MIB = 1024 * 1024
GRPC_MAX_MESSAGE_BYTES = 256 * MIB  # above any max_message_size, so the policy check answers
GRPC_GRACE_SECONDS = 1.0  # calls in progress at stop get this long to finish
SYSTEM_NAMESPACES = ("default", "system")
SYSTEM_TOPIC = TopicName("system", "_events_topic")
S3_OPTION_NAMES = {"access_key": "key", "secret_key": "secret", "anonymous": "anon"}


def storage_settings(config: BrokerConfig) -> StorageSettings:
    """Map the `wal_cloud` block onto the storage engine's settings."""
    wal, up = config.wal, config.uploader
    wal_config = WalConfig(
        root=wal.dir, file_name=wal.file_name, fsync_interval_ms=wal.interval_ms,
        max_batch_bytes=wal.max_batch_bytes, rotate_max_bytes=wal.rotation_max_bytes,
        rotate_max_seconds=int(wal.rotation_max_hours * 3600) if wal.rotation_max_hours else None,
        durable=wal.durable, cache_capacity=wal.cache_capacity,
    )
    return StorageSettings(
        wal=wal_config,
        cloud_url=cloud_url(config),
        cloud_options=cloud_options(config),
        root_prefix=up.root_prefix,
        uploader_interval_s=float(up.interval_seconds),
        max_object_bytes=up.max_object_mb * MIB if up.max_object_mb else None,
        retention_max_age_s=wal.retention_time_minutes * 60.0 if wal.retention_time_minutes else None,
        retention_max_total_bytes=wal.retention_size_mb * MIB if wal.retention_size_mb else None,
        retention_check_interval_s=wal.retention_check_interval_minutes * 60.0,
    )


def cloud_url(config: BrokerConfig) -> str:
    cloud = config.cloud
    if cloud.backend == "memory":
        return cloud.root if cloud.root.startswith("memory://") else "memory://" + cloud.root.strip("/")
    if cloud.backend == "s3" and not cloud.root.startswith("s3://"):
        raise ConfigError(f"config {config.source}: wal_cloud.cloud.root={cloud.root!r} is invalid; "
                          "expected s3://bucket[/prefix] for backend s3")
    return cloud.root


def cloud_options(config: BrokerConfig) -> dict[str, Any]:
    """Danube's S3 option names (region, endpoint, access_key, ...) as s3fs options; others as given."""
    options: dict[str, Any] = {}
    client_kwargs: dict[str, Any] = {}
    for name, value in config.cloud.options.items():
        if config.cloud.backend == "s3" and name == "region":
            client_kwargs["region_name"] = value
        elif config.cloud.backend == "s3" and name == "endpoint":
            client_kwargs["endpoint_url"] = value
        elif config.cloud.backend == "s3" and name == "virtual_host_style":
            options["config_kwargs"] = {"s3": {"addressing_style": "virtual" if value else "path"}}
        elif config.cloud.backend == "s3" and name in S3_OPTION_NAMES:
            options[S3_OPTION_NAMES[name]] = value
        else:
            options[name] = value
    if client_kwargs:
        options["client_kwargs"] = {**options.get("client_kwargs", {}), **client_kwargs}
    return options


def _port_open(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


class BrokerServer:
    """One broker process; `start`, then `wait` or `stop`."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.broker_id = random_id()
        self.metadata: MetadataStore | None = None
        self.lookups: CachedMetadataStore | None = None  # the store, reads from the local cache
        self.service: BrokerService | None = None
        self._etcd: EmbeddedEtcd | None = None
        self._wal_http: WalHttpServer | None = None
        self._dir_lock: DataDirLock | None = None
        self._resumed_lease: Lease | None = None
        self._grpc: grpc.aio.Server | None = None
        self._front: SendFront | None = None
        self._engine: StorageEngine | None = None
        self._membership: ClusterMembership | None = None
        self._election: LeaseElection | None = None
        self._assigner: TopicAssigner | None = None
        self._metrics: MetricsServer | None = None
        self._stopping = False
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        cfg = self.config
        self._dir_lock = DataDirLock(cfg.wal.dir)
        metadata = self.metadata = await asyncio.to_thread(self._connect_metadata)
        await asyncio.to_thread(self._resume_identity, metadata)
        await asyncio.to_thread(self._bootstrap_metadata, metadata)
        # A stale read of the lookup cache only delays what a client sees.
        cache = await asyncio.to_thread(open_lookup_cache, metadata, f"broker-{self.broker_id}")
        lookups = self.lookups = CachedMetadataStore(metadata, cache)
        engine = self._engine = StorageEngine(storage_settings(cfg), metadata, self.broker_id)
        registry = TopicRegistry(lookups)
        service = self.service = BrokerService(cfg, registry, engine, self.broker_id, asyncio.get_running_loop(),
                                               served_keys=ServedTopicKeys(cache))
        self._grpc = grpc.aio.server(options=[
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", GRPC_MAX_MESSAGE_BYTES),
        ])
        add_services(self._grpc, service)
        self._serve_metrics()
        add_schema_registry(self._grpc, metadata)
        native = use_native_front(cfg.listener.grpc_front, cfg.source)
        grpc_address = "127.0.0.1:0" if native else cfg.listener.bind_address  # behind the front: loopback only
        grpc_port = self._grpc.add_insecure_port(grpc_address)
        if grpc_port == 0:
            raise ConfigError(f"config {cfg.source}: cannot listen on {grpc_address} (port in use?)")
        await self._grpc.start()
        if native:
            self._front = SendFront(service, cfg.listener.bind_address, f"127.0.0.1:{grpc_port}",
                                    GRPC_MAX_MESSAGE_BYTES, GRPC_GRACE_SECONDS, cfg.source)
        await asyncio.to_thread(self._join_cluster, metadata, lookups, service, engine)
        logger.info("broker %d serving on %s (advertised %s), etcd %s", self.broker_id,
                    cfg.listener.bind_address, cfg.listener.broker_url, cfg.meta_store.endpoint)

    def _serve_metrics(self) -> None:
        """Prometheus metrics (`broker.metrics`) on `broker.ports.prometheus`, if set: Danube's
        `prom_exporter`, the address this broker registers."""
        listener = self.config.listener
        if listener.prometheus_port is None or self.service is None:
            return
        from broker.metrics import BrokerCollector, MetricsServer

        election = lambda: self._election is not None and self._election.is_leader  # noqa: E731
        try:
            self._metrics = MetricsServer(BrokerCollector(self.service, self.broker_id, election),
                                          listener.host, listener.prometheus_port)
        except OSError as exc:
            raise ConfigError(f"config {self.config.source}: broker.ports.prometheus: cannot listen on "
                              f"{listener.host}:{listener.prometheus_port}: {exc.strerror or exc}") from exc

    def _connect_metadata(self) -> MetadataStore:
        """The cluster's etcd. Only with `meta_store.embedded` set does the broker start one
        where none answers; otherwise an unreachable etcd fails the start, naming the keys."""
        store = self.config.meta_store
        if store.embedded and not _port_open(store.host, store.port):
            from danube_core.embedded_etcd import EmbeddedEtcd

            self._etcd = EmbeddedEtcd(data_dir=store.data_dir, client_port=store.port)
            logger.info("started an embedded etcd on %s (data in %s)", self._etcd.endpoint, store.data_dir)
        return store.etcd.connect()

    def _bootstrap_metadata(self, metadata: MetadataStore) -> None:
        namespaces = Namespaces(metadata)
        for name in (*SYSTEM_NAMESPACES, *self.config.bootstrap_namespaces):
            namespaces.ensure(name, self.config.policies)
        metadata.put_if_absent(topic_root_key(SYSTEM_TOPIC), dump_u64(0))

    def _join_cluster(
        self, metadata: MetadataStore, lookups: CachedMetadataStore, service: BrokerService, engine: StorageEngine
    ) -> None:
        cfg = self.config
        registration = BrokerRegistration(
            admin_addr=f"http://{cfg.listener.admin_addr}",
            broker_url=cfg.listener.broker_url,
            connect_url=cfg.listener.connect_url,
            prom_exporter=f"{cfg.listener.host}:{cfg.listener.prometheus_port}" if cfg.listener.prometheus_port else None,
            wal_url=self._wal_url(),
        )
        self._membership = ClusterMembership(
            lookups, self.broker_id, registration, cfg.cluster_name, cfg.coordination,
            resumed_lease=self._resumed_lease,
            on_registered=lambda lease_id: write_identity(cfg.wal.dir, BrokerIdentity(self.broker_id, lease_id)))
        service.registration_held = self._membership.registration_held
        self._membership.join(service)
        self._assigner = TopicAssigner(lookups, engine.keys)
        coordination = cfg.coordination
        self._election = broker_election(metadata, self.broker_id, coordination.leader_ttl_seconds,
                                         coordination.leader_check_interval_seconds,
                                         on_elected=self._assigner.start, on_deposed=self._assigner.stop)
        self._election.start()

    def _resume_identity(self, metadata: MetadataStore) -> None:
        """Take the previous process's id and registration back if its lease still lives
        (`broker.identity`); the WAL root is locked, so that process is gone."""
        previous = read_identity(self.config.wal.dir)
        self._resumed_lease = resume_identity(metadata, previous, self.config.coordination.register_ttl_seconds)
        if self._resumed_lease is not None and previous is not None:
            self.broker_id = previous.broker_id
            logger.info("restarting as broker %d on its own data (%s): its registration is still alive, "
                        "so its topics were not moved and load now", self.broker_id, self.config.wal.dir)

    def _wal_url(self) -> str:
        """Where readers find this broker's WAL: served over HTTP if configured, else its path."""
        cfg = self.config
        if cfg.wal.http_listen is None:
            return "file://" + os.path.abspath(cfg.wal.dir)
        host, port = parse_listen(cfg.wal.http_listen)
        self._wal_http = WalHttpServer(cfg.wal.dir, host, port).start()
        advertised = urlsplit(cfg.listener.broker_url).hostname if host in ("0.0.0.0", "::") else host
        return self._wal_http.url(advertised)

    async def wait(self) -> None:
        await self._stopped.wait()

    async def stop(self) -> None:
        """Hand topics over, leave the cluster, stop serving. Safe to call twice."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        try:
            await self._shutdown()
        finally:
            self._stopped.set()
        logger.info("broker %d stopped", self.broker_id)

    async def _shutdown(self) -> None:
        if self._election is not None:
            await asyncio.to_thread(self._election.stop)
        if self._assigner is not None:
            await asyncio.to_thread(self._assigner.stop)
        if self.service is not None:
            await self.service.shutdown()
        if self._membership is not None:
            await asyncio.to_thread(self._membership.leave)
        if self._front is not None:
            await self._front.close()
        if self._grpc is not None:
            await self._grpc.stop(grace=GRPC_GRACE_SECONDS)
        if self.lookups is not None:
            self.lookups.close()
        if self.metadata is not None:
            self.metadata.close()
        if self._wal_http is not None:
            self._wal_http.stop()
        if self._metrics is not None:
            self._metrics.close()
        if self._etcd is not None:
            self._etcd.stop()
        if self._dir_lock is not None:
            self._dir_lock.release()
