"""The JSON values of the speed layer's etcd keys (compact, sorted), parsed into frozen objects.

Unknown fields are ignored on read, so a newer master's records stay readable by an older one.
A value that is not what its key should hold raises `MetadataError` naming the key.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterator

from danube_core.errors import MetadataError

# Admission status of an epoch (seed §6): PENDING -> PLANNED -> ASSIGNED, or FAILED; an epoch
# the lifecycle retired (TTL, LRU within the quota) ends EVICTED: no replicas, kept for a while
# so that `status` and the audit trail show what happened, then deleted.
PENDING, PLANNED, ASSIGNED, FAILED = "PENDING", "PLANNED", "ASSIGNED", "FAILED"
EVICTED = "EVICTED"
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


@contextmanager
def _reading(key: str, kind: str, caught: tuple[type[Exception], ...] = (TypeError,)) -> Iterator[None]:
    """Turn `caught` (what building a record from a JSON object of the wrong shape raises) into the
    MetadataError this module promises, naming the key and what it should hold (`kind`, e.g.
    "a worker record"), with the cause chained."""
    try:
        yield
    except caught as exc:
        raise MetadataError(f"{key}: not {kind}: {exc}") from exc


@dataclass(frozen=True)
class WorkerRecord:
    """`/workers/{tenant}/{worker}`: a live worker as its master registered it."""

    address: str
    memory_bytes: int
    cpu_cores: int
    master_id: str
    memory_used_bytes: int = 0
    metrics_address: str = ""  # host:port of its Prometheus endpoint ("": none), for the console

    def to_json(self) -> bytes:
        return dump(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes, key: str) -> "WorkerRecord":
        with _reading(key, "a worker record"):
            return cls(**_pick(cls, load(raw, key)))


@dataclass(frozen=True)
class ReplicaRecord:
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
    replicas: dict[str, ReplicaRecord] = field(default_factory=dict)
    updated_ms: int = 0
    created_ms: int = 0
    ready_ms: int = 0        # when a first replica became READY (0: never)
    base_epoch: str = ""     # an incremental epoch: the epoch it adds files to
    kind: str = "full"       # full (admitted or rebuilt), incremental, or shard
    load_failures: dict[str, str] = field(default_factory=dict)
    # A sharded epoch (too big for one worker) has no replicas of its own: `shards` names its
    # shard records (epoch ids `{epoch}.s{i}`), each placed, replicated and loaded like an epoch,
    # and `ready_shards` counts those with a READY replica (the leader keeps it current); it is
    # queryable only when every shard is. A shard record names its epoch in `shard_of` and the
    # partition values its files hold in `shard_values` (column -> sorted values, "" for null;
    # empty for an unpartitioned table), which the gateway prunes shards by.
    shards: tuple[str, ...] = ()
    ready_shards: int = 0
    shard_of: str = ""
    shard_values: dict[str, list[str]] = field(default_factory=dict)

    def to_json(self) -> bytes:
        value = asdict(self)
        value["shards"] = list(self.shards)
        return dump(value)

    @classmethod
    def from_json(cls, raw: bytes, key: str) -> "AssignmentRecord":
        value = load(raw, key)
        with _reading(key, "an assignment record"):
            replicas = {w: ReplicaRecord(**_pick(ReplicaRecord, r)) for w, r in value.get("replicas", {}).items()}
            failures = {str(w): str(why) for w, why in value.get("load_failures", {}).items()}
            shard_values = {str(c): [str(v) for v in vs] for c, vs in value.get("shard_values", {}).items()}
            return cls(**{**_pick(cls, value), "replicas": replicas, "load_failures": failures,
                          "shards": tuple(str(s) for s in value.get("shards", ())), "shard_values": shard_values})

    def with_replica(self, worker: str, replica: ReplicaRecord | None) -> "AssignmentRecord":
        replicas = dict(self.replicas)
        if replica is None:
            replicas.pop(worker, None)
        else:
            replicas[worker] = replica
        return replace(self, replicas=replicas)

    @property
    def live(self) -> bool:
        """Counts against quotas and is kept placed: everything but FAILED and EVICTED."""
        return self.status not in (FAILED, EVICTED)

    def staying(self) -> tuple[str, ...]:
        """The workers the epoch is placed on, leaving replicas excluded (sorted)."""
        return tuple(sorted(w for w, r in self.replicas.items() if not r.leaving))

    def ready_workers(self) -> list[str]:
        return sorted(w for w, r in self.replicas.items() if r.state == R_READY)

    @property
    def order(self) -> tuple[int, int, str]:
        """Newer epochs of a dataset sort after older ones: by source version, then creation."""
        return (self.version, self.created_ms, self.epoch)

    @property
    def sharded(self) -> bool:
        """An epoch served through shards (it holds no replicas itself)."""
        return bool(self.shards)

    def settled(self) -> bool:
        """Every staying replica finished loading (READY or FAILED): nothing of it is in flight."""
        staying = [r for r in self.replicas.values() if not r.leaving]
        return bool(staying) and all(r.state in (R_READY, R_FAILED) for r in staying)


DEFAULT_GATHER_MAX_BYTES = 256 * 1024 * 1024  # TenantConfig.gather_max_bytes when a tenant sets none


@dataclass(frozen=True)
class TenantConfig:
    """`/tenants/{tenant}/config`. `memory_quota_bytes` 0: no tenant limit. `source_roots`:
    table URIs this tenant may admit start with one of these (empty: any). `topic_namespaces`:
    the namespaces whose topics this tenant's datasets may serve the tail of (empty: any)."""

    memory_quota_bytes: int = 0
    source_roots: tuple[str, ...] = ()
    replication_factor: int = 0  # 0: the global default
    epoch_ttl_s: float = 0.0     # 0: the global default_ttl_sec
    # An epoch estimated above this is split into shards of at most about this much each.
    # 0: derived from the tenant's workers (`master.sharding.shard_limit`).
    shard_max_bytes: int = 0
    # A query on a sharded epoch that cannot be combined from the shards' answers (count DISTINCT,
    # median, window functions, joins, ...) is run whole at the gateway when the shards it reads
    # are estimated at no more than this in memory (their rows it needs are gathered there);
    # 0: never gather, such a query is refused.
    gather_max_bytes: int = DEFAULT_GATHER_MAX_BYTES
    topic_namespaces: tuple[str, ...] = ()

    def to_json(self) -> bytes:
        return dump({**asdict(self), "source_roots": list(self.source_roots),
                     "topic_namespaces": list(self.topic_namespaces)})

    @classmethod
    def from_json(cls, raw: bytes, key: str) -> "TenantConfig":
        value = load(raw, key)
        quota = value.get("memory_quota_bytes")
        if quota is None and "memory_quota_gb" in value:  # the seed's example unit
            quota = int(float(value["memory_quota_gb"]) * 1024**3)
        with _reading(key, "a tenant config", (TypeError, ValueError)):
            return cls(memory_quota_bytes=int(quota or 0),
                       source_roots=tuple(str(r) for r in value.get("source_roots", ())),
                       replication_factor=int(value.get("replication_factor", 0)),
                       epoch_ttl_s=float(value.get("epoch_ttl_s", 0.0)),
                       shard_max_bytes=int(value.get("shard_max_bytes", 0)),
                       gather_max_bytes=int(value.get("gather_max_bytes", DEFAULT_GATHER_MAX_BYTES)),
                       topic_namespaces=tuple(str(n) for n in value.get("topic_namespaces", ())))


STRATEGIES = ("round_robin", "rendezvous", "capacity")


@dataclass(frozen=True)
class GlobalConfig:
    """`/config/global`: cluster-wide settings, hot-reloaded by every master.

    `memory_quota_bytes` 0: no global limit. `reassign_delay_s`: how long a lost worker's
    epochs wait before moving (a worker back within it keeps them). `memory_expansion_factor`:
    in-memory size estimated from Parquet bytes. `default_ttl_sec` (the seed's key): how long an
    epoch stays held once a newer epoch of its dataset is served. `refresh_poll_interval_s`: how
    often the leader looks for Delta versions nobody announced. `evicted_retention_s`: how long
    an EVICTED record stays visible before it is deleted. `max_load_failures`: on how many workers an
    epoch may fail to load before no further worker is tried (a plan that cannot be loaded
    anywhere must not walk through every worker of a large tenant).
    """

    memory_quota_bytes: int = 0
    replication_factor: int = 2
    strategy: str = "rendezvous"
    reassign_delay_s: float = 5.0
    memory_expansion_factor: float = 2.0
    log_level: str = "INFO"
    default_ttl_sec: float = 30.0
    refresh_poll_interval_s: float = 5.0
    evicted_retention_s: float = 300.0
    max_load_failures: int = 3

    def to_json(self) -> bytes:
        return dump(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes, key: str) -> "GlobalConfig":
        value = load(raw, key)
        with _reading(key, "a global config"):
            config = cls(**_pick(cls, value))
        if config.strategy not in STRATEGIES or config.replication_factor < 1:
            raise MetadataError(f"{key}: strategy must be one of {STRATEGIES} and replication_factor >= 1")
        if config.default_ttl_sec < 0 or config.refresh_poll_interval_s <= 0 or config.evicted_retention_s < 0:
            raise MetadataError(f"{key}: default_ttl_sec and evicted_retention_s must be >= 0, "
                                "refresh_poll_interval_s > 0")
        if not isinstance(config.max_load_failures, int) or config.max_load_failures < 1:
            raise MetadataError(f"{key}: max_load_failures={config.max_load_failures!r}: expected an integer >= 1")
        return config


@dataclass(frozen=True)
class DatasetSpec:
    """`/tenants/{tenant}/datasets/{dataset}` (seed §13): what a dataset follows.

    Written when a Delta table is admitted at its latest version (not pinned): the leader then
    plans a new epoch for every new version of `table_uri` (announced or found by polling),
    with the same `partitions` and `replication`.
    """

    source_type: str
    source_uri: str
    partitions: tuple[dict[str, str], ...] = ()
    replication: int = 0
    follow: bool = True
    # The dataset serves its topic's tail (`speedlayer.tail_spec.TailSpec` JSON, without
    # offsets: each epoch's plan gets its own); empty: no tail.
    tail: str = ""

    def to_json(self) -> bytes:
        value = {**asdict(self), "partitions": [dict(p) for p in self.partitions]}
        if not self.tail:
            del value["tail"]  # a spec without a tail reads as before tails existed
        return dump(value)

    @classmethod
    def from_json(cls, raw: bytes, key: str) -> "DatasetSpec":
        value = load(raw, key)
        with _reading(key, "a dataset spec", (KeyError, TypeError, ValueError, AttributeError)):
            return cls(source_type=str(value["source_type"]), source_uri=str(value["source_uri"]),
                       partitions=tuple({str(k): str(v) for k, v in p.items()} for p in value.get("partitions", ())),
                       replication=int(value.get("replication", 0)), follow=bool(value.get("follow", True)),
                       tail=str(value.get("tail", "")))


@dataclass(frozen=True)
class Announcement:
    """`/announce/{tenant}/{dataset}`: a writer committed `version` of `table_uri` (-1: unknown).

    Written by pipelines after the Delta commit and the cursor commit; a hint that wakes the
    leader (which reads the Delta log itself), never trusted as the table's content."""

    table_uri: str
    version: int = -1
    writer: str = ""
    committed_ms: int = 0

    def to_json(self) -> bytes:
        return dump(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes, key: str) -> "Announcement":
        with _reading(key, "an announcement"):
            return cls(**_pick(cls, load(raw, key)))
