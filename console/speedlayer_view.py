"""What the speed-layer page shows, from the console's etcd cache: tenants with their quota and
what their live epochs use of it (estimate × replicas, as the master's quotas count it), datasets
and their epochs with each replica's state, workers with their memory and the epochs they hold,
drains in progress, and the writers' announcements. Query latency and failures come from the
gateway's Prometheus endpoint (`gateway_queries_total`, `gateway_query_seconds`), read by the page.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from danube_core.errors import DanubeError
from speedlayer.keys import SpeedLayerKeys
from speedlayer.records import Announcement, AssignmentRecord, DatasetSpec, GlobalConfig, TenantConfig, WorkerRecord

from console.topics import KeyReader, ParsedValues


@dataclass(frozen=True)
class WorkerRow:
    tenant: str
    worker: str
    record: WorkerRecord
    draining: bool
    epochs: list[str] = field(default_factory=list)  # dataset/epoch: state


@dataclass(frozen=True)
class DatasetRow:
    tenant: str
    dataset: str
    spec: DatasetSpec | None
    epochs: list[AssignmentRecord]  # newest first
    announcement: Announcement | None


@dataclass(frozen=True)
class TenantRow:
    tenant: str
    config: TenantConfig | None
    used_bytes: int  # live epochs' estimates × their replicas
    datasets: list[DatasetRow]
    workers: list[WorkerRow]

    @property
    def quota_bytes(self) -> int:
        return self.config.memory_quota_bytes if self.config is not None else 0


@dataclass(frozen=True)
class SpeedLayerState:
    global_config: GlobalConfig | None
    tenants: list[TenantRow]
    problems: list[str] = field(default_factory=list)  # values that could not be read, by key


class SpeedLayerReader:
    def __init__(self, keys: SpeedLayerKeys) -> None:
        self.keys = keys
        self._parsed = ParsedValues()

    def state(self, cache: KeyReader) -> SpeedLayerState:
        problems: list[str] = []
        epochs = self._records(cache, self.keys.assignments_prefix, AssignmentRecord.from_json, problems)
        workers = self._records(cache, self.keys.workers_prefix, WorkerRecord.from_json, problems)
        specs = self._records(cache, self.keys.tenants_prefix, _dataset_spec, problems)
        configs = self._records(cache, self.keys.tenants_prefix, _tenant_config, problems)
        announced = self._records(cache, self.keys.announce_prefix, Announcement.from_json, problems)
        drains = {key[len(self.keys.drain_prefix):] for key, _ in cache.get_prefix(self.keys.drain_prefix, True)}
        by_tenant: dict[str, list[AssignmentRecord]] = {}
        for record in epochs.values():
            by_tenant.setdefault(record.tenant, []).append(record)
        tenants = set(by_tenant) | {self._tail(k, self.keys.workers_prefix)[0] for k in workers}
        tenants |= {self._tail(k, self.keys.tenants_prefix)[0] for k in (*specs, *configs)}
        rows = []
        for tenant in sorted(t for t in tenants if t):
            records = by_tenant.get(tenant, [])
            datasets = sorted({r.dataset for r in records}
                              | {self._tail(k, self.keys.tenants_prefix)[2] for k in specs if k.startswith(
                                  self.keys.datasets_prefix(tenant))})
            rows.append(TenantRow(
                tenant, configs.get(self.keys.tenant_config(tenant)),
                sum(r.estimated_memory_bytes * max(1, len(r.replicas)) for r in records if r.live),
                [DatasetRow(tenant, d, specs.get(self.keys.dataset_spec(tenant, d)),
                            sorted((r for r in records if r.dataset == d), key=lambda r: r.order, reverse=True),
                            announced.get(self.keys.announce(tenant, d))) for d in datasets],
                self._workers(tenant, workers, records, drains)))
        raw_global = cache.get(self.keys.global_config)
        global_config = None
        if raw_global is not None:
            try:
                global_config = self._parsed.get(self.keys.global_config, raw_global, GlobalConfig.from_json)
            except DanubeError as exc:
                problems.append(str(exc))
        return SpeedLayerState(global_config, rows, problems)

    def _workers(self, tenant: str, workers: dict[str, WorkerRecord], records: list[AssignmentRecord],
                 drains: set[str]) -> list[WorkerRow]:
        out = []
        for key, record in sorted(workers.items()):
            owner, worker = self._tail(key, self.keys.workers_prefix)[:2]
            if owner != tenant:
                continue
            held = [f"{r.dataset}/{r.epoch}: {r.replicas[worker].state}" for r in records if worker in r.replicas]
            out.append(WorkerRow(tenant, worker, record, f"{tenant}/{worker}" in drains, held))
        return out

    def _records(self, cache: KeyReader, prefix: str, parse, problems: list[str]) -> dict:
        found = {}
        for key, raw in cache.get_prefix(prefix):
            try:
                value = self._parsed.get(key, raw, parse)
            except DanubeError as exc:
                problems.append(str(exc))
                continue
            if value is not None:
                found[key] = value
        return found

    @staticmethod
    def _tail(key: str, prefix: str) -> list[str]:
        return key[len(prefix):].split("/") + ["", ""]


def _dataset_spec(raw: bytes, key: str) -> DatasetSpec | None:
    """Only `/tenants/{t}/datasets/{d}` keys under the tenants prefix."""
    parts = key.rsplit("/", 3)
    return DatasetSpec.from_json(raw, key) if len(parts) == 4 and parts[2] == "datasets" else None


def _tenant_config(raw: bytes, key: str) -> TenantConfig | None:
    return TenantConfig.from_json(raw, key) if key.endswith("/config") else None
