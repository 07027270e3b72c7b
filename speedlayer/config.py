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
_TOP_LEVEL = {"etcd", "master", "sources"}


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


def load_master_config(path: str | None, overrides: Mapping[str, Any] | None = None,
                       environ: Mapping[str, str] | None = None) -> MasterConfig:
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
    etcd, master = data.get("etcd") or {}, data.get("master") or {}
    sources = data.get("sources") or {}
    for key, value in (overrides or {}).items():
        if value is not None:
            master[key] = value
    port = _int(master, "port", where, 7700)
    master_id = str(master.get("id") or f"{socket.gethostname()}-{port}")
    endpoints = etcd.get("endpoints", "127.0.0.1:2379")
    if isinstance(endpoints, list):
        endpoints = ",".join(endpoints)
    return MasterConfig(
        master_id=master_id, host=str(master.get("host", "127.0.0.1")), port=port,
        etcd_endpoints=str(endpoints), key_root=str(etcd.get("key_root", "") or ""),
        election_ttl_seconds=_int(master, "election_ttl_seconds", where, 5),
        heartbeat_interval_seconds=_int(master, "heartbeat_interval_seconds", where, 5),
        metrics_port=_int(master, "metrics_port", where, None),
        audit_log=master.get("audit_log"),
        delta_storage_options={str(k): str(v) for k, v in
                               ((sources.get("delta") or {}).get("storage_options") or {}).items()},
        iceberg_catalogs=dict((sources.get("iceberg") or {}).get("catalogs") or {}),
    )
