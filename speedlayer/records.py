"""The JSON values of the speed layer's etcd keys (compact, sorted), parsed into frozen objects.

Unknown fields are ignored on read, so a newer master's records stay readable by an older one.
A value that is not what its key should hold raises `MetadataError` naming the key.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from danube_core.errors import MetadataError

# Admission status of an epoch (seed §6): PENDING -> PLANNED -> ASSIGNED, or FAILED.
PENDING, PLANNED, ASSIGNED, FAILED = "PENDING", "PLANNED", "ASSIGNED", "FAILED"
# State of one replica of an epoch on one worker. Only READY may be queried.
R_ASSIGNED, R_LOADING, R_READY, R_FAILED = "ASSIGNED", "LOADING", "READY", "FAILED"


def dump(value: dict[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def load(raw: bytes, key: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise MetadataError(f"{key} holds no JSON: {raw[:80]!r}") from exc
    if not isinstance(value, dict):
        raise MetadataError(f"{key} holds {type(value).__name__}, expected a JSON object")
    return value


def _pick(cls: type, value: dict[str, Any]) -> dict[str, Any]:
    names = cls.__dataclass_fields__.keys()  # type: ignore[attr-defined]
    return {name: value[name] for name in names if name in value}


@dataclass(frozen=True)
class WorkerRecord:
    """`/workers/{tenant}/{worker}`: a live worker as its master registered it."""

    address: str
    memory_bytes: int
    cpu_cores: int
    master_id: str
    memory_used_bytes: int = 0

    def to_json(self) -> bytes:
        return dump(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes, key: str) -> "WorkerRecord":
        try:
            return cls(**_pick(cls, load(raw, key)))
        except TypeError as exc:
            raise MetadataError(f"{key}: not a worker record: {exc}") from exc


@dataclass(frozen=True)
class Replica:
    """One worker's copy of an epoch: its state and, once READY, what the load took.

    `leaving`: the epoch is moving off this worker (balance, drain); the replica stays, and
    queryable, until the replicas replacing it are READY (make before break).
    """

    state: str = R_ASSIGNED
    rows: int = 0
    bytes: int = 0
    seconds: float = 0.0
    error: str = ""
    leaving: bool = False


@dataclass(frozen=True)
class AssignmentRecord:
    """`/assignments/{tenant}/{dataset}/{epoch}`: an epoch's admission status and placement.

    `load_failures`: worker -> the reason its load FAILED. Such a worker is no longer a replica
    and is never chosen for this epoch again; the replica is placed on another worker of the
    tenant until `GlobalConfig.max_load_failures` workers have failed.
    """

    tenant: str
    dataset: str
    epoch: str
    request_id: str
    status: str
    message: str = ""
    version: int = -1
    total_rows: int = 0
    file_count: int = 0
    estimated_memory_bytes: int = 0
    replication: int = 2
    replicas: dict[str, Replica] = field(default_factory=dict)
    updated_ms: int = 0
    load_failures: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> bytes:
        value = asdict(self)
        return dump(value)

    @classmethod
    def from_json(cls, raw: bytes, key: str) -> "AssignmentRecord":
        value = load(raw, key)
        try:
            replicas = {w: Replica(**_pick(Replica, r)) for w, r in value.get("replicas", {}).items()}
            failures = {str(w): str(why) for w, why in value.get("load_failures", {}).items()}
            return cls(**{**_pick(cls, value), "replicas": replicas, "load_failures": failures})
        except TypeError as exc:
            raise MetadataError(f"{key}: not an assignment record: {exc}") from exc

    def with_replica(self, worker: str, replica: Replica | None) -> "AssignmentRecord":
        replicas = dict(self.replicas)
        if replica is None:
            replicas.pop(worker, None)
        else:
            replicas[worker] = replica
        return replace(self, replicas=replicas)

    @property
    def live(self) -> bool:
        """Counts against quotas and is kept placed: everything but FAILED."""
        return self.status != FAILED

    def staying(self) -> tuple[str, ...]:
        """The workers the epoch is placed on, leaving replicas excluded (sorted)."""
        return tuple(sorted(w for w, r in self.replicas.items() if not r.leaving))

    def ready_workers(self) -> list[str]:
        return sorted(w for w, r in self.replicas.items() if r.state == R_READY)


@dataclass(frozen=True)
class TenantConfig:
    """`/tenants/{tenant}/config`. `memory_quota_bytes` 0: no tenant limit. `source_roots`:
    table URIs this tenant may admit start with one of these (empty: any)."""

    memory_quota_bytes: int = 0
    source_roots: tuple[str, ...] = ()
    replication_factor: int = 0  # 0: the global default

    def to_json(self) -> bytes:
        return dump({**asdict(self), "source_roots": list(self.source_roots)})

    @classmethod
    def from_json(cls, raw: bytes, key: str) -> "TenantConfig":
        value = load(raw, key)
        quota = value.get("memory_quota_bytes")
        if quota is None and "memory_quota_gb" in value:  # the seed's example unit
            quota = int(float(value["memory_quota_gb"]) * 1024**3)
        try:
            return cls(memory_quota_bytes=int(quota or 0),
                       source_roots=tuple(str(r) for r in value.get("source_roots", ())),
                       replication_factor=int(value.get("replication_factor", 0)))
        except (TypeError, ValueError) as exc:
            raise MetadataError(f"{key}: not a tenant config: {exc}") from exc


STRATEGIES = ("round_robin", "rendezvous", "capacity")


@dataclass(frozen=True)
class GlobalConfig:
    """`/config/global`: cluster-wide settings, hot-reloaded by every master.

    `memory_quota_bytes` 0: no global limit. `reassign_delay_s`: how long a lost worker's
    epochs wait before moving (a worker back within it keeps them). `memory_expansion_factor`:
    in-memory size estimated from Parquet bytes. `max_load_failures`: on how many workers an
    epoch may fail to load before no further worker is tried (a plan that cannot be loaded
    anywhere must not walk through every worker of a large tenant).
    """

    memory_quota_bytes: int = 0
    replication_factor: int = 2
    strategy: str = "rendezvous"
    reassign_delay_s: float = 5.0
    memory_expansion_factor: float = 2.0
    log_level: str = "INFO"
    max_load_failures: int = 3

    def to_json(self) -> bytes:
        return dump(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes, key: str) -> "GlobalConfig":
        value = load(raw, key)
        try:
            config = cls(**_pick(cls, value))
        except TypeError as exc:
            raise MetadataError(f"{key}: not a global config: {exc}") from exc
        if config.strategy not in STRATEGIES or config.replication_factor < 1:
            raise MetadataError(f"{key}: strategy must be one of {STRATEGIES} and replication_factor >= 1")
        if not isinstance(config.max_load_failures, int) or config.max_load_failures < 1:
            raise MetadataError(f"{key}: max_load_failures={config.max_load_failures!r}: expected an integer >= 1")
        return config
