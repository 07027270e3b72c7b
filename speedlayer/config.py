"""Master configuration: `conf/speedlayer.yaml`, environment overrides, checked up front.

Environment overrides (as the broker's `DANUBE_...`): `SPEEDLAYER_<KEY>__<KEY>...=<yaml scalar>`,
e.g. `SPEEDLAYER_MASTER__PORT=7702` or `SPEEDLAYER_ETCD__ENDPOINTS=10.0.0.5:2379`. Command-line
flags (`--id`, `--port`, `--metrics-port`) override both. A bad value raises `ConfigError`
naming the file, the key and what is expected. Cluster-wide settings that may change at run
time (quotas, replication, strategy, reassignment delay) live in etcd (`/config/global`), not here.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any, Mapping

import yaml

from danube_core.errors import ConfigError

ENV_PREFIX = "SPEEDLAYER_"
_TOP_LEVEL = {"etcd", "master", "sources", "gateway"}


@dataclass(frozen=True)
class MasterConfig:
    master_id: str
    host: str
    port: int
    etcd_endpoints: str
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


def _env_overrides(data: dict[str, Any], environ: Mapping[str, str]) -> None:
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX):].split("__")]
        if path[0] not in _TOP_LEVEL:
            continue
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else {}
        node[path[-1]] = yaml.safe_load(raw)


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
    _env_overrides(data, os.environ if environ is None else environ)
    return data, where


def _endpoints(etcd: dict[str, Any]) -> str:
    endpoints = etcd.get("endpoints", "127.0.0.1:2379")
    return ",".join(endpoints) if isinstance(endpoints, list) else str(endpoints)


def load_master_config(path: str | None, overrides: Mapping[str, Any] | None = None,
                       environ: Mapping[str, str] | None = None) -> MasterConfig:
    data, where = _read(path, environ)
    etcd, master = data.get("etcd") or {}, data.get("master") or {}
    sources = data.get("sources") or {}
    for key, value in (overrides or {}).items():
        if value is not None:
            master[key] = value
    port = _int(master, "port", where, 7700)
    master_id = str(master.get("id") or f"{socket.gethostname()}-{port}")
    return MasterConfig(
        master_id=master_id, host=str(master.get("host", "127.0.0.1")), port=port,
        etcd_endpoints=_endpoints(etcd), key_root=str(etcd.get("key_root", "") or ""),
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
    Limits are caps (a query may ask for less) and defaults."""

    host: str
    port: int
    etcd_endpoints: str
    key_root: str = ""
    max_result_rows: int = 1_000_000
    max_result_bytes: int = 256 * 1024 * 1024
    query_timeout_ms: int = 30_000
    retry_buffer_bytes: int = 4 * 1024 * 1024
    tokens: dict[str, str] = field(default_factory=dict, repr=False)
    require_tokens: bool = False
    metrics_port: int | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def load_gateway_config(path: str | None, overrides: Mapping[str, Any] | None = None,
                        environ: Mapping[str, str] | None = None) -> GatewayConfig:
    data, where = _read(path, environ)
    etcd, gateway = data.get("etcd") or {}, dict(data.get("gateway") or {})
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
        etcd_endpoints=_endpoints(etcd), key_root=str(etcd.get("key_root", "") or ""),
        max_result_rows=_int(gateway, "max_result_rows", where, 1_000_000),
        max_result_bytes=_int(gateway, "max_result_bytes", where, 256 * 1024 * 1024),
        query_timeout_ms=_int(gateway, "query_timeout_ms", where, 30_000),
        retry_buffer_bytes=_int(gateway, "retry_buffer_bytes", where, 4 * 1024 * 1024, minimum=0),
        tokens={str(k): v for k, v in tokens.items()}, require_tokens=require,
        metrics_port=_int(gateway, "metrics_port", where, None))
