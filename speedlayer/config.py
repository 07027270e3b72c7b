"""Master configuration: `conf/speedlayer.yaml`, environment overrides, checked up front.

Environment overrides (as the broker's `DANUBE_...`, both `danube_core.env_overrides`):
`SPEEDLAYER_<KEY>__<KEY>...=<yaml scalar>`, e.g. `SPEEDLAYER_MASTER__PORT=7702`,
`SPEEDLAYER_ETCD__ENDPOINTS=10.0.0.5:2379` or `SPEEDLAYER_ETCD__PASSWORD=...` (taken as written).
Command-line flags (`--id`, `--port`, `--metrics-port`) override both.

The `etcd:` section (masters and gateways; workers need no etcd) takes the broker's
`meta_store` keys for a secured etcd: `endpoints`, `key_root`, `user`, `password` (put it in
`SPEEDLAYER_ETCD__PASSWORD`, not the file), `ca_cert`, `cert_key`, `cert_cert`, `timeout_ms`,
checked into `danube_core.etcd_settings.EtcdSettings`. A bad value raises `ConfigError`
naming the file, the key and what is expected. Cluster-wide settings that may change at run
time (quotas, replication, strategy, reassignment delay) live in etcd (`/config/global`), not here.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any, Mapping

import yaml

from danube_core.env_overrides import apply_env_overrides
from danube_core.errors import ConfigError
from danube_core.etcd_settings import SECTION_KEYS, EtcdKeyNames, EtcdSettings, parse_etcd_settings

from speedlayer.keys import valid_id

ENV_PREFIX = "SPEEDLAYER_"
_TOP_LEVEL = {"etcd", "master", "sources", "gateway", "worker"}


@dataclass(frozen=True)
class MasterConfig:
    master_id: str
    host: str
    port: int
    etcd: EtcdSettings
    key_root: str = ""
    election_ttl_seconds: int = 5
    heartbeat_interval_seconds: int = 5
    metrics_port: int | None = None
    audit_log: str | None = None
    delta_storage_options: dict[str, str] = field(default_factory=dict)
    iceberg_catalogs: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def etcd_endpoints(self) -> str:
        return self.etcd.endpoints


def _int(section: dict, key: str, where: str, default: Any, minimum: int = 1) -> Any:
    value = section.get(key, default)
    if value is None and default is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{where}: {key}={value!r}: expected an integer >= {minimum}")
    return value


def _read(path: str | None, environ: Mapping[str, str] | None) -> tuple[dict[str, Any], str]:
    """The config file's mapping with environment overrides applied, and its name for errors."""
    data: dict[str, Any] = {}
    if path:
        try:
            with open(path, encoding="utf-8") as handle:
                data = yaml.safe_load(handle) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"speed layer config {path!r} cannot be read: {exc}") from exc
    where = path or "<defaults>"
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping at the top level")
    apply_env_overrides(data, os.environ if environ is None else environ, prefix=ENV_PREFIX, sections=_TOP_LEVEL,
                        source=where)
    return data, where


def _etcd(data: dict[str, Any], where: str) -> tuple[EtcdSettings, str]:
    """The `etcd:` section: how to reach etcd, and the key root."""
    etcd = data.get("etcd") or {}
    if not isinstance(etcd, dict):
        raise ConfigError(f"{where}: etcd: expected a mapping with keys {', '.join(SECTION_KEYS)}, key_root")
    unknown = sorted(str(k) for k in etcd if k not in (*SECTION_KEYS, "key_root"))
    if unknown:
        raise ConfigError(f"{where}: etcd.{unknown[0]}: unknown key; accepted: {', '.join(SECTION_KEYS)}, key_root")

    def error(key: str, value: Any, expected: str) -> ConfigError:
        return ConfigError(f"{where}: {key}={value!r}: expected {expected}")

    names = EtcdKeyNames.section("etcd", where=f"speed layer config {where}")
    settings = parse_etcd_settings(etcd, names, error, default_endpoints="127.0.0.1:2379")
    return settings, str(etcd.get("key_root", "") or "")


def load_master_config(path: str | None, overrides: Mapping[str, Any] | None = None,
                       environ: Mapping[str, str] | None = None) -> MasterConfig:
    data, where = _read(path, environ)
    (etcd, key_root), master = _etcd(data, where), data.get("master") or {}
    sources = data.get("sources") or {}
    for key, value in (overrides or {}).items():
        if value is not None:
            master[key] = value
    port = _int(master, "port", where, 7700)
    master_id = str(master.get("id") or f"{socket.gethostname()}-{port}")
    return MasterConfig(
        master_id=master_id, host=str(master.get("host", "127.0.0.1")), port=port,
        etcd=etcd, key_root=key_root,
        election_ttl_seconds=_int(master, "election_ttl_seconds", where, 5),
        heartbeat_interval_seconds=_int(master, "heartbeat_interval_seconds", where, 5),
        metrics_port=_int(master, "metrics_port", where, None),
        audit_log=master.get("audit_log"),
        delta_storage_options={str(k): str(v) for k, v in
                               ((sources.get("delta") or {}).get("storage_options") or {}).items()},
        iceberg_catalogs=dict((sources.get("iceberg") or {}).get("catalogs") or {}),
    )


@dataclass(frozen=True)
class GatewayConfig:
    """The Data Gateway (`gateway:` section). `tokens`: tenant -> token the tenant's clients
    must present (`authorization: Bearer <token>`); `require_tokens`: refuse tenants without one.
    Limits are caps (a query may ask for less) and defaults. Flight SQL clients log in with the
    same tokens (user = tenant, password = token) and get a session that lasts
    `flight_sql_session_ttl_s`. `tls_cert_file`/`tls_key_file` (PEM) serve TLS (`grpc+tls://`);
    with `tls_client_ca_file` too, clients must present a certificate that CA signed."""

    host: str
    port: int
    etcd: EtcdSettings
    key_root: str = ""
    max_result_rows: int = 1_000_000
    max_result_bytes: int = 256 * 1024 * 1024
    query_timeout_ms: int = 30_000
    retry_buffer_bytes: int = 4 * 1024 * 1024
    tokens: dict[str, str] = field(default_factory=dict, repr=False)
    require_tokens: bool = False
    metrics_port: int | None = None
    flight_sql_session_ttl_s: int = 8 * 3600
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def tls(self) -> bool:
        return self.tls_cert_file is not None

    @property
    def etcd_endpoints(self) -> str:
        return self.etcd.endpoints


def load_gateway_config(path: str | None, overrides: Mapping[str, Any] | None = None,
                        environ: Mapping[str, str] | None = None) -> GatewayConfig:
    data, where = _read(path, environ)
    (etcd, key_root), gateway = _etcd(data, where), dict(data.get("gateway") or {})
    for key, value in (overrides or {}).items():
        if value is not None:
            gateway[key] = value
    tokens = gateway.get("tokens") or {}
    if not isinstance(tokens, dict) or not all(isinstance(v, str) and v for v in tokens.values()):
        raise ConfigError(f"{where}: gateway.tokens: expected a mapping tenant -> non-empty token")
    require = gateway.get("require_tokens", False)
    if not isinstance(require, bool):
        raise ConfigError(f"{where}: gateway.require_tokens={require!r}: expected true or false")
    return GatewayConfig(
        host=str(gateway.get("host", "127.0.0.1")), port=_int(gateway, "port", where, 7800, minimum=0),
        etcd=etcd, key_root=key_root,
        max_result_rows=_int(gateway, "max_result_rows", where, 1_000_000),
        max_result_bytes=_int(gateway, "max_result_bytes", where, 256 * 1024 * 1024),
        query_timeout_ms=_int(gateway, "query_timeout_ms", where, 30_000),
        retry_buffer_bytes=_int(gateway, "retry_buffer_bytes", where, 4 * 1024 * 1024, minimum=0),
        tokens={str(k): v for k, v in tokens.items()}, require_tokens=require,
        metrics_port=_int(gateway, "metrics_port", where, None),
        flight_sql_session_ttl_s=_int(gateway, "flight_sql_session_ttl_seconds", where, 8 * 3600),
        **_gateway_tls(gateway, where))


def _gateway_tls(gateway: Mapping[str, Any], where: str) -> dict[str, str | None]:
    """`tls_cert_file` and `tls_key_file` together (or neither); `tls_client_ca_file` only with them."""
    files = {name: gateway.get(name) for name in ("tls_cert_file", "tls_key_file", "tls_client_ca_file")}
    for name, value in files.items():
        if value is not None and (not isinstance(value, str) or not value):
            raise ConfigError(f"{where}: gateway.{name}={value!r}: expected a path to a PEM file")
    if (files["tls_cert_file"] is None) != (files["tls_key_file"] is None):
        raise ConfigError(f"{where}: gateway.tls_cert_file and gateway.tls_key_file go together (both or neither)")
    if files["tls_client_ca_file"] is not None and files["tls_cert_file"] is None:
        raise ConfigError(f"{where}: gateway.tls_client_ca_file needs gateway.tls_cert_file and tls_key_file")
    return files


@dataclass(frozen=True)
class WorkerConfig:
    """A worker (`worker:` section; `python -m speedlayer worker` flags override it).

    `masters`: host:port of the masters (the agent follows the leader among them); `listen`:
    host:port of the worker's Flight query service (port 0: any free port); `address`: where the
    gateway reaches that service, registered with the master ("": the listen host with the port
    bound, `advertised_address`). `memory_bytes` is DuckDB's memory limit and the capacity the
    worker reports; `storage_options` are fsspec options per protocol (`{"s3": {...}}`). The
    result limits are the worker's caps and defaults for a query (a query may ask for less).
    The worker needs no etcd: it talks only to the masters.
    """

    tenant: str
    worker_id: str
    masters: tuple[str, ...]
    listen: str = "127.0.0.1:0"
    address: str = ""
    memory_bytes: int = 2 * 1024**3
    cpu_cores: int = 2
    threads: int = 2
    storage_options: dict[str, dict] = field(default_factory=dict, repr=False)
    max_result_rows: int = 1_000_000
    max_result_bytes: int = 256 * 1024 * 1024
    query_timeout_ms: int = 30_000
    metrics_port: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "masters", tuple(self.masters))  # a list given by a caller stays unchanged

    def advertised_address(self, bound_port: int) -> str:
        """The address to register: `address`, else the listen host with the port the service bound."""
        return self.address or f"{self.listen.rpartition(':')[0]}:{bound_port}"


def _worker_text(worker: dict, key: str, flag: str, where: str, default: str | None) -> str:
    value = worker.get(key, default)
    if value is None:
        raise ConfigError(f"{where}: worker.{key} (or {flag}) is required")
    return str(value)


def _worker_id(worker: dict, key: str, flag: str, where: str, default: str | None) -> str:
    value = _worker_text(worker, key, flag, where, default)
    if not valid_id(value):
        raise ConfigError(f"{where}: worker.{key}={value!r} ({flag}): expected 1-128 of letters, digits, '_', '.', '-'")
    return value


def load_worker_config(path: str | None, overrides: Mapping[str, Any] | None = None,
                       environ: Mapping[str, str] | None = None) -> WorkerConfig:
    """The `worker:` section of `path` (may be None), `SPEEDLAYER_WORKER__<KEY>` overrides, then
    `overrides` (the command line's flags; None values are left out), checked up front."""
    data, where = _read(path, environ)
    worker = {k: v for k, v in (data.get("worker") or {}).items() if v is not None}  # null: the default
    for key, value in (overrides or {}).items():
        if value is not None:
            worker[key] = value
    tenant = _worker_id(worker, "tenant", "--tenant", where, None)
    worker_id = _worker_id(worker, "id", "--id", where, f"{socket.gethostname()}-{os.getpid()}")
    raw_masters = worker.get("masters")
    masters = tuple(m.strip() for m in (raw_masters if isinstance(raw_masters, list) else
                                        str(raw_masters or "").split(",")) if str(m).strip())
    if not masters:
        raise ConfigError(f"{where}: worker.masters (or --masters) is required: host:port of the masters")
    listen = _worker_text(worker, "listen", "--listen", where, "127.0.0.1:0")
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"{where}: worker.listen={listen!r} (--listen): expected host:port")
    storage_options = worker.get("storage_options") or {}
    if not isinstance(storage_options, dict) or not all(isinstance(v, dict) for v in storage_options.values()):
        raise ConfigError(f"{where}: worker.storage_options: expected a mapping protocol -> options")
    return WorkerConfig(
        tenant=tenant, worker_id=worker_id, masters=masters, listen=listen,
        address=str(worker.get("address") or ""),
        memory_bytes=_int(worker, "memory_bytes", where, 2 * 1024**3),
        cpu_cores=_int(worker, "cpu_cores", where, os.cpu_count() or 1),
        threads=_int(worker, "threads", where, 2),
        storage_options={str(k): dict(v) for k, v in storage_options.items()},
        max_result_rows=_int(worker, "max_result_rows", where, 1_000_000),
        max_result_bytes=_int(worker, "max_result_bytes", where, 256 * 1024 * 1024),
        query_timeout_ms=_int(worker, "query_timeout_ms", where, 30_000),
        metrics_port=_int(worker, "metrics_port", where, None))
