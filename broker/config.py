"""Broker configuration: Danube's `danube_broker.yml` keys, environment overrides, checked up front.

The file uses the key names of Danube's shipped `config/danube_broker.yml` where they apply
(`cluster_name`, `broker.host`/`ports`, `meta_store`, `bootstrap_namespaces`,
`auto_create_topics`, `policies`, `load_manager.load_report_interval_seconds`, `wal_cloud.*`),
so an existing Danube config file mostly works as it is. Keys this broker adds are marked
"extension" in `conf/broker.yaml`: `meta_store.embedded`, `wal_cloud.wal.file_sync.durable`,
`coordination.*` (lease TTLs, lookup wait) and `subscriptions.*` (dispatch window, cursor
flushing).

Environment overrides: `DANUBE_<KEY>__<KEY>...=<yaml scalar>`, e.g.
`DANUBE_BROKER__PORTS__CLIENT=6651` or `DANUBE_WAL_CLOUD__WAL__DIR=/data/wal`. Values are read
as YAML (`null`, `true`, numbers, `[a, b]`), the password (`DANUBE_META_STORE__PASSWORD`) as
written. Only variables naming a known top-level key are used (`danube_core.env_overrides`).

Every value is checked before anything starts; a bad one raises `ConfigError` naming the file,
the key and what is expected.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, overload

import yaml

from danube_core.env_overrides import apply_env_overrides
from danube_core.errors import ConfigError
from danube_core.etcd_settings import EtcdKeyNames, EtcdSettings, parse_etcd_settings
from danube_core.records import Policies

from broker.option_scope import OptionScope

logger = logging.getLogger(__name__)

ENV_PREFIX = "DANUBE_"
LOOPBACK_FOR_ANY = {"0.0.0.0": "127.0.0.1", "::": "::1"}
# Who serves the client port (our extension, `broker.grpc_front`): "native" answers
# SendMessage in Rust and hands the rest to Python's gRPC server (broker/send_front.py), and
# fails at start where its extension (broker._grpc_front) was not built; "python" is Python's
# gRPC server alone; "auto" (the default) is "native" where the extension was built and
# "python" otherwise, said once at start (an install without cargo has no extension).
GRPC_FRONTS = ("auto", "native", "python")

_TOP_LEVEL = {
    "cluster_name", "broker", "meta_store", "bootstrap_namespaces", "auto_create_topics",
    "auth", "load_manager", "wal_cloud", "policies", "coordination", "subscriptions",
}


@dataclass(frozen=True)
class ListenerConfig:
    """Where the gRPC server binds and the URLs it advertises in its registration and lookups."""

    host: str
    client_port: int
    admin_port: int
    prometheus_port: int | None
    broker_url: str
    connect_url: str
    grpc_front: str = "auto"

    @property
    def bind_address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.client_port}"

    @property
    def admin_addr(self) -> str:
        """`host:port` of the admin endpoint as registered (Danube adds the scheme itself)."""
        return f"{self.host}:{self.admin_port}"


@dataclass(frozen=True)
class MetaStoreConfig:
    """The etcd server; `embedded` (default false) starts a local one on this port if nothing
    listens there, for a trial on one machine; production brokers leave it off, so an etcd
    that is briefly down is waited for by the operator, not replaced by an empty one.

    Our extension for secured clusters: `user`/`password` (etcd authentication) and
    `ca_cert` (TLS) with optional `cert_key`/`cert_cert` (client certificate), in `etcd`
    (`danube_core.etcd_settings`). Put the password in the environment
    (`DANUBE_META_STORE__PASSWORD`), not the file; it is never logged.
    """

    host: str
    port: int
    embedded: bool
    data_dir: str
    etcd: EtcdSettings

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class CoordinationConfig:
    """Lease TTLs and timings of cluster coordination (Danube hard-codes 32 s and 14 s)."""

    register_ttl_seconds: int = 32
    leader_ttl_seconds: int = 14
    leader_check_interval_seconds: float = 2.0
    load_report_interval_seconds: float = 30.0
    lookup_wait_seconds: float = 10.0


@dataclass(frozen=True)
class SubscriptionConfig:
    """Reliable dispatch: unacked messages in flight per subscription and cursor flushing."""

    max_unacked_messages: int = 1000
    cursor_flush_every_acks: int = 1000
    cursor_flush_interval_seconds: float = 5.0


@dataclass(frozen=True)
class WalSection:
    """`wal_cloud.wal`: the local WAL of every reliable topic."""

    dir: str = "./danube-data/wal"
    file_name: str = "wal.log"
    cache_capacity: int = 1024
    interval_ms: int = 5000
    max_batch_bytes: int = 10 * 1024 * 1024
    durable: bool = True
    rotation_max_bytes: int | None = None
    rotation_max_hours: float | None = None
    retention_time_minutes: int | None = None
    retention_size_mb: int | None = None
    retention_check_interval_minutes: int = 5
    http_listen: str | None = None  # our extension: serve the WAL root read-only over HTTP


@dataclass(frozen=True)
class UploaderSection:
    """`wal_cloud.uploader`: WAL → cloud objects; `root_prefix` roots the storage etcd keys."""

    enabled: bool = True
    interval_seconds: int = 30
    root_prefix: str = "/danube"
    max_object_mb: int | None = None


@dataclass(frozen=True)
class CloudSection:
    """`wal_cloud.cloud`: backend (fs, s3, memory), root, and the other keys as backend options."""

    backend: str = "fs"
    root: str = "./danube-data/cloud-storage"
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BrokerConfig:
    """Everything a broker process needs, parsed once and frozen."""

    source: str
    cluster_name: str
    listener: ListenerConfig
    meta_store: MetaStoreConfig
    bootstrap_namespaces: tuple[str, ...]
    auto_create_topics: bool
    policies: Policies
    coordination: CoordinationConfig
    subscriptions: SubscriptionConfig
    wal: WalSection
    uploader: UploaderSection
    cloud: CloudSection


class _Reader:
    """Typed access to one YAML mapping, with errors naming the file and the dotted key."""

    def __init__(self, source: str, path: str, raw: Any) -> None:
        self.source, self.path = source, path
        self.scope = OptionScope(f"config {source}:")
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise self.scope.invalid(path or "<top level>", raw, "a mapping")
        self.raw = raw

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def only(self, allowed: set[str]) -> None:
        for name in self.raw:
            if name not in allowed:
                raise self.scope.invalid(self.key(str(name)), self.raw[name],
                                         "one of the keys " + ", ".join(sorted(allowed)))

    def section(self, name: str) -> "_Reader":
        return _Reader(self.source, self.key(name), self.raw.get(name))

    def value(self, name: str, default: Any, check: Callable[[Any], bool], expected: str) -> Any:
        value = self.raw.get(name, default)
        if value is None and default is None:
            return None
        if not check(value):
            raise self.scope.invalid(self.key(name), value, expected)
        return value

    # A value with a default is never None: the overloads say so to the callers.
    @overload
    def integer(self, name: str, default: int, minimum: int = 0, maximum: int = 2**64 - 1) -> int: ...
    @overload
    def integer(self, name: str, default: None, minimum: int = 0, maximum: int = 2**64 - 1) -> int | None: ...
    def integer(self, name: str, default: int | None, minimum: int = 0, maximum: int = 2**64 - 1) -> int | None:
        ok = lambda v: type(v) is int and minimum <= v <= maximum  # noqa: E731 - bool is not an int here
        return self.value(name, default, ok, f"an integer in {minimum}..{maximum}")

    @overload
    def number(self, name: str, default: float, minimum: float = 0.0) -> float: ...
    @overload
    def number(self, name: str, default: None, minimum: float = 0.0) -> float | None: ...
    def number(self, name: str, default: float | None, minimum: float = 0.0) -> float | None:
        ok = lambda v: type(v) in (int, float) and v >= minimum  # noqa: E731
        return self.value(name, default, ok, f"a number >= {minimum}")

    @overload
    def text(self, name: str, default: str) -> str: ...
    @overload
    def text(self, name: str, default: None) -> str | None: ...
    def text(self, name: str, default: str | None) -> str | None:
        return self.value(name, default, lambda v: isinstance(v, str) and v != "", "a non-empty string")

    def flag(self, name: str, default: bool) -> bool:
        return self.value(name, default, lambda v: isinstance(v, bool), "true or false")


def load_config(path: str, environ: Mapping[str, str] | None = None) -> BrokerConfig:
    """Read `path`, apply `DANUBE_...` overrides from `environ` (default: os.environ), validate."""
    try:
        with open(path, encoding="utf-8") as handle:
            raw = yaml.safe_load(handle)
    except OSError as exc:
        raise ConfigError(f"config file {path!r} cannot be read: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path!r} is not valid YAML: {exc}") from exc
    raw = raw if raw is not None else {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config {path}: the top level must be a mapping, got {type(raw).__name__}")
    apply_env_overrides(raw, os.environ if environ is None else environ, prefix=ENV_PREFIX, sections=_TOP_LEVEL,
                        source=path)
    return parse_config(raw, path)


def parse_config(raw: dict, source: str) -> BrokerConfig:
    """Validate an already-loaded mapping (file + overrides) into a `BrokerConfig`."""
    top = _Reader(source, "", raw)
    top.only(_TOP_LEVEL)
    _check_auth(top.section("auth"))
    _check_load_manager(top.section("load_manager"))
    namespaces = top.value("bootstrap_namespaces", [], _is_name_list, "a list of namespace names")
    wal_cloud = top.section("wal_cloud")
    wal_cloud.only({"wal", "uploader", "cloud", "metadata"})
    return BrokerConfig(
        source=source,
        cluster_name=top.text("cluster_name", "MY_CLUSTER"),
        listener=_listener(top.section("broker")),
        meta_store=_meta_store(top.section("meta_store")),
        bootstrap_namespaces=tuple(namespaces),
        auto_create_topics=top.flag("auto_create_topics", True),
        policies=_policies(top.section("policies")),
        coordination=_coordination(top.section("coordination"), top.section("load_manager")),
        subscriptions=_subscriptions(top.section("subscriptions")),
        wal=_wal(wal_cloud.section("wal")),
        uploader=_uploader(wal_cloud.section("uploader")),
        cloud=_cloud(wal_cloud.section("cloud")),
    )


def _is_name_list(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, str) and v and all(ch.isalnum() or ch in "_-" for ch in v) for v in value
    )


def _check_auth(auth: _Reader) -> None:
    # TLS/JWT are not implemented: refuse rather than silently serve plaintext.
    auth.value("mode", "none", lambda v: v == "none", "'none' (tls and tlswithjwt are not supported)")


def _check_load_manager(section: _Reader) -> None:
    section.only({"assignment_strategy", "load_report_interval_seconds", "rebalancing"})
    section.value("assignment_strategy", "fair", lambda v: v in ("fair", "balanced", "weighted_load"),
                  "one of fair, balanced, weighted_load")
    rebalancing = section.section("rebalancing")
    rebalancing.value("enabled", False, lambda v: v is False, "false (automatic rebalancing is not supported)")


def _listener(broker: _Reader) -> ListenerConfig:
    broker.only({"host", "ports", "advertised_listeners", "grpc_front"})
    ports = broker.section("ports")
    ports.only({"client", "admin", "prometheus"})
    host = broker.text("host", "127.0.0.1")
    client = ports.integer("client", 6650, 1, 65535)
    advertised = broker.section("advertised_listeners")
    advertised.only({"broker_url", "connect_url"})
    default_url = f"http://{LOOPBACK_FOR_ANY.get(host, host)}:{client}"
    broker_url = _with_scheme(advertised.text("broker_url", default_url))
    return ListenerConfig(
        host=host,
        client_port=client,
        admin_port=ports.integer("admin", 50051, 1, 65535),
        prometheus_port=ports.integer("prometheus", None, 1, 65535),
        broker_url=broker_url,
        connect_url=_with_scheme(advertised.text("connect_url", broker_url)),
        grpc_front=broker.value("grpc_front", "auto", lambda v: v in GRPC_FRONTS,
                                 f"one of {', '.join(GRPC_FRONTS)}"),
    )


def _with_scheme(url: str) -> str:
    return url if "://" in url else f"http://{url}"


def _meta_store(section: _Reader) -> MetaStoreConfig:
    section.only({"host", "port", "embedded", "data_dir", "user", "password", "ca_cert", "cert_key", "cert_cert"})
    host, port = section.text("host", "127.0.0.1"), section.integer("port", 2379, 1, 65535)
    names = EtcdKeyNames.section(section.path, where=f"config {section.source}")
    names = dataclasses.replace(names, endpoints=f"{section.key('host')}/{section.key('port')}")
    return MetaStoreConfig(
        host=host,
        port=port,
        embedded=section.flag("embedded", False),
        data_dir=section.text("data_dir", "./danube-data/etcd"),
        etcd=parse_etcd_settings({**section.raw, "endpoints": f"{host}:{port}"}, names, section.scope.invalid),
    )


def _policies(section: _Reader) -> Policies:
    names = [f.name for f in Policies.__dataclass_fields__.values()]
    section.only(set(names))
    defaults = Policies()
    return Policies(**{n: section.integer(n, getattr(defaults, n), 0, 2**32 - 1) for n in names})


def _coordination(section: _Reader, load_manager: _Reader) -> CoordinationConfig:
    section.only({"register_ttl_seconds", "leader_ttl_seconds", "leader_check_interval_seconds",
                  "lookup_wait_seconds"})
    d = CoordinationConfig()
    return CoordinationConfig(
        register_ttl_seconds=section.integer("register_ttl_seconds", d.register_ttl_seconds, 1, 3600),
        leader_ttl_seconds=section.integer("leader_ttl_seconds", d.leader_ttl_seconds, 1, 3600),
        leader_check_interval_seconds=section.number("leader_check_interval_seconds",
                                                     d.leader_check_interval_seconds, 0.05),
        load_report_interval_seconds=load_manager.number("load_report_interval_seconds",
                                                         d.load_report_interval_seconds, 0.1),
        lookup_wait_seconds=section.number("lookup_wait_seconds", d.lookup_wait_seconds, 0.0),
    )


def _subscriptions(section: _Reader) -> SubscriptionConfig:
    section.only({"max_unacked_messages", "cursor_flush_every_acks", "cursor_flush_interval_seconds"})
    d = SubscriptionConfig()
    return SubscriptionConfig(
        max_unacked_messages=section.integer("max_unacked_messages", d.max_unacked_messages, 1, 1_000_000),
        cursor_flush_every_acks=section.integer("cursor_flush_every_acks", d.cursor_flush_every_acks, 1),
        cursor_flush_interval_seconds=section.number("cursor_flush_interval_seconds",
                                                     d.cursor_flush_interval_seconds, 0.0),
    )


def _wal(section: _Reader) -> WalSection:
    section.only({"dir", "file_name", "cache_capacity", "file_sync", "rotation", "retention", "http_listen"})
    sync, rotation, retention = section.section("file_sync"), section.section("rotation"), section.section("retention")
    sync.only({"interval_ms", "max_batch_bytes", "durable"})
    rotation.only({"max_bytes", "max_hours"})
    retention.only({"time_minutes", "size_mb", "check_interval_minutes"})
    d = WalSection()
    return WalSection(
        dir=section.text("dir", d.dir),
        file_name=section.text("file_name", d.file_name),
        cache_capacity=section.integer("cache_capacity", d.cache_capacity),
        interval_ms=sync.integer("interval_ms", d.interval_ms, 1),
        max_batch_bytes=sync.integer("max_batch_bytes", d.max_batch_bytes, 1),
        durable=sync.flag("durable", d.durable),
        rotation_max_bytes=rotation.integer("max_bytes", None, 1),
        rotation_max_hours=rotation.number("max_hours", None, 0.001),
        retention_time_minutes=retention.integer("time_minutes", None, 1),
        retention_size_mb=retention.integer("size_mb", None, 1),
        retention_check_interval_minutes=retention.integer("check_interval_minutes", 5, 1),
        http_listen=section.value("http_listen", None, _is_listen, "host:port (port 0 picks a free one)"),
    )


def _is_listen(value: object) -> bool:
    from broker.wal_http import parse_listen

    try:
        parse_listen(str(value))
    except ValueError:
        return False
    return True


def _uploader_enabled(section: _Reader, default: bool) -> bool:
    """Parsed and ignored, as by Danube v0.7.3 (the uploader always runs; a topic move seals
    after uploading). `false` gets a warning so nobody counts on it."""
    enabled = section.flag("enabled", default)
    if not enabled:
        logger.warning("config %s: %s=false is ignored, as by Danube v0.7.3: the uploader always runs "
                       "(a long interval_seconds defers uploads)", section.source, section.key("enabled"))
    return enabled


def _uploader(section: _Reader) -> UploaderSection:
    section.only({"enabled", "interval_seconds", "root_prefix", "max_object_mb"})
    d = UploaderSection()
    return UploaderSection(
        enabled=_uploader_enabled(section, d.enabled),
        interval_seconds=section.integer("interval_seconds", d.interval_seconds, 1),
        root_prefix=section.text("root_prefix", d.root_prefix),
        max_object_mb=section.integer("max_object_mb", None, 1),
    )


def _cloud(section: _Reader) -> CloudSection:
    # As in Danube's config, backend options (region, endpoint, access_key, ...) sit next to
    # `backend` and `root`; they are handed to the object store as they are.
    options = {k: v for k, v in section.raw.items() if k not in ("backend", "root")}
    return CloudSection(
        backend=section.value("backend", "fs", lambda v: v in ("fs", "s3", "memory"), "one of fs, s3, memory"),
        root=section.text("root", CloudSection.root),
        options=options,
    )
