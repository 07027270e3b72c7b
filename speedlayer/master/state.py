"""The leader's view of the cluster: assignment records, live workers, drains, configs.

Loaded from etcd when a master becomes leader and kept current by watches (workers, drains,
configs) and by the leader's own writes (records: only the leader writes them, always through
`update_record`, a compare-and-put loop, so a deposed leader's late write cannot clobber).
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from typing import Callable

from danube_core.errors import MetadataError
from danube_core.metadata import MetadataStore, WatchEvent, WatchHandle

from speedlayer.api.v1 import control_plane_service_pb2 as cp
from speedlayer.keys import SpeedLayerKeys
from speedlayer.master.record_index import EpochRef, RecordIndex, StatusCounts
from speedlayer.observability.metrics import WORKERS_LOST
from speedlayer.records import AssignmentRecord, GlobalConfig, TenantConfig, WorkerRecord

logger = logging.getLogger(__name__)

WorkerKey = tuple[str, str]  # (tenant, worker)


class ConfigView:
    """`/config/global` and `/tenants/*/config`, hot-reloaded through watches (seed §14)."""

    def __init__(self, metadata: MetadataStore, keys: SpeedLayerKeys,
                 on_change: Callable[[], None] = lambda: None) -> None:
        self._metadata, self._keys, self._on_change = metadata, keys, on_change
        self.global_config = GlobalConfig()
        self.tenants: dict[str, TenantConfig] = {}
        self._watches: list[WatchHandle] = []

    def start(self) -> None:
        self._watches = [self._metadata.watch_prefix(self._keys.global_config, self._on_event),
                         self._metadata.watch_prefix(self._keys.tenants_prefix, self._on_event)]
        raw = self._metadata.get(self._keys.global_config)
        if raw is not None:
            self._apply(WatchEvent("put", self._keys.global_config, raw))
        for key, value in self._metadata.get_prefix(self._keys.tenants_prefix):
            self._apply(WatchEvent("put", key, value))

    def stop(self) -> None:
        for watch in self._watches:
            watch.cancel()

    def tenant(self, tenant: str) -> TenantConfig:
        return self.tenants.get(tenant, TenantConfig())

    def _on_event(self, event: WatchEvent) -> None:
        self._apply(event)
        self._on_change()

    def _apply(self, event: WatchEvent) -> None:
        try:
            if event.key == self._keys.global_config:
                self.global_config = (GlobalConfig.from_json(event.value, event.key)
                                      if event.value is not None else GlobalConfig())
                logger.info("global config now %s", self.global_config)
                logging.getLogger().setLevel(self.global_config.log_level.upper())
            elif event.key.endswith("/config") and event.key.count("/", len(self._keys.tenants_prefix)) == 1:
                tenant = event.key[len(self._keys.tenants_prefix):-len("/config")]
                if event.value is None:
                    self.tenants.pop(tenant, None)
                else:
                    self.tenants[tenant] = TenantConfig.from_json(event.value, event.key)
                logger.info("tenant %s config now %s", tenant, self.tenants.get(tenant), extra={"tenant_id": tenant})
        except (MetadataError, ValueError) as exc:  # a bad edit keeps the last good config
            logger.error("ignoring config change at %s: %s", event.key, exc)


def encode_plan(plan: cp.LoadPlan) -> bytes:
    return zlib.compress(plan.SerializeToString(), 1)


def decode_plan(raw: bytes) -> cp.LoadPlan:
    plan = cp.LoadPlan()
    plan.ParseFromString(zlib.decompress(raw))
    return plan


class ClusterState:
    """What the leader knows; `changed` is called after any change that may move epochs."""

    def __init__(self, metadata: MetadataStore, keys: SpeedLayerKeys, changed: Callable[[], None]) -> None:
        self.metadata, self.keys = metadata, keys
        self._changed = changed
        self._lock = threading.RLock()
        self.records: dict[str, AssignmentRecord] = {}
        self.workers: dict[WorkerKey, WorkerRecord] = {}
        self.lost_since: dict[WorkerKey, float] = {}
        self.draining: set[WorkerKey] = set()
        self.loaded_at = time.monotonic()
        self._at_takeover: dict[WorkerKey, WorkerRecord] = {}
        self.known_at_takeover: set[WorkerKey] = set()
        self._raw: dict[str, bytes] = {}  # the bytes each cached record was read or written as
        self._plans: dict[str, cp.LoadPlan] = {}  # plans are immutable: read once
        self._watches: list[WatchHandle] = []
        # Derived from `records`, changed with them (admission and each pass read it, not a scan).
        self.index = RecordIndex()
        self._workers_generation = 0  # bumped by every change of workers, losses and drains

    def load(self) -> None:
        """Read everything, then follow workers and drains; workers named by records but not
        registered start their grace period now (they may be reconnecting to this leader)."""
        self._watches = [self.metadata.watch_prefix(self.keys.workers_prefix, self._on_worker),
                         self.metadata.watch_prefix(self.keys.drain_prefix, self._on_drain)]
        for key, raw in self.metadata.get_prefix(self.keys.workers_prefix):
            worker_key = self.keys.parse_worker(key)
            self.workers[worker_key] = WorkerRecord.from_json(raw, key)
            WORKERS_LOST.labels(tenant=worker_key[0])  # at 0 before its first loss: see _on_worker
        for key, _ in self.metadata.get_prefix(self.keys.drain_prefix, keys_only=True):
            tenant, _, worker = key[len(self.keys.drain_prefix):].partition("/")
            self.draining.add((tenant, worker))
        for key, raw in self.metadata.get_prefix(self.keys.assignments_prefix):
            self._cache(key, AssignmentRecord.from_json(raw, key), raw)
        now = time.monotonic()
        self.loaded_at = now
        self._at_takeover = dict(self.workers)
        self.known_at_takeover = set(self.workers)
        for record in self.records.values():
            for worker in record.replicas:
                self.known_at_takeover.add((record.tenant, worker))
                if (record.tenant, worker) not in self.workers:
                    self.lost_since.setdefault((record.tenant, worker), now)

    def close(self) -> None:
        for watch in self._watches:
            watch.cancel()

    def _on_worker(self, event: WatchEvent) -> None:
        key = self.keys.parse_worker(event.key)
        with self._lock:
            self._workers_generation += 1
            if event.value is None:
                if self.workers.pop(key, None) is not None:
                    self.lost_since[key] = time.monotonic()
                    if key not in self.draining:  # a drained worker leaving is the drain's end, not a loss
                        WORKERS_LOST.labels(tenant=key[0]).inc()
                        logger.warning("worker %s/%s lost (its lease expired)", *key,
                                       extra={"tenant_id": key[0], "worker_id": key[1]})
                if key in self.draining:  # a drained worker that left: a new one of that id starts afresh
                    self.draining.discard(key)
                    threading.Thread(target=self.metadata.delete, args=(self.keys.drain(*key),), daemon=True).start()
                    logger.info("worker %s/%s left after its drain", *key,
                                extra={"tenant_id": key[0], "worker_id": key[1]})
            else:
                self.workers[key] = WorkerRecord.from_json(event.value, event.key)
                self.lost_since.pop(key, None)
                # The tenant's series exists (at 0) before its first loss: `increase()` over a
                # series born at 1 would miss that loss.
                WORKERS_LOST.labels(tenant=key[0])
        self._changed()

    def _on_drain(self, event: WatchEvent) -> None:
        tenant, _, worker = event.key[len(self.keys.drain_prefix):].partition("/")
        with self._lock:
            self._workers_generation += 1
            (self.draining.discard if event.value is None else self.draining.add)((tenant, worker))
        self._changed()

    def snapshot(self) -> tuple[list[AssignmentRecord], dict[WorkerKey, WorkerRecord], dict[WorkerKey, float], set[WorkerKey]]:
        with self._lock:
            return list(self.records.values()), dict(self.workers), dict(self.lost_since), set(self.draining)

    def generation(self) -> tuple[int, int]:
        """Changes with every change of a record, a worker, a loss or a drain (and only then)."""
        with self._lock:
            return self.index.generation, self._workers_generation

    def is_draining(self, key: WorkerKey) -> bool:
        with self._lock:
            return key in self.draining

    def worker_loads(self) -> dict[WorkerKey, tuple[int, int]]:
        """(tenant, worker) -> (bytes, replicas) the live records put there (`RecordIndex`)."""
        with self._lock:
            return self.index.worker_loads()

    def usage(self, tenant: str) -> tuple[int, int]:
        """(the tenant's, the cluster's) memory in use by live epochs, as `quotas` counts it."""
        with self._lock:
            return self.index.usage(tenant)

    def epoch_counts(self) -> tuple[int, tuple[StatusCounts, StatusCounts]]:
        """`epoch_counts` of the epochs' records and of the shards' records, after the number
        of their last change (the same number: the same counts)."""
        with self._lock:
            return self.index.counts_generation, self.index.epoch_counts()

    def counts_generation(self) -> int:
        with self._lock:
            return self.index.counts_generation

    def placement_view(self) -> tuple[dict[WorkerKey, int], list[AssignmentRecord]]:
        """`RecordIndex.placement_counts` and `RecordIndex.short`, taken together."""
        with self._lock:
            return self.index.placement_counts(), self.index.short()

    def take_desired(self) -> dict[WorkerKey, dict[str, AssignmentRecord]]:
        """What each worker whose epochs changed since the last call should hold (one caller:
        the reconciler's loop)."""
        with self._lock:
            return self.index.take_desired()

    def superseded(self) -> frozenset[EpochRef]:
        """`lifecycle.superseded_keys` of the records."""
        with self._lock:
            return self.index.superseded()

    def view(self) -> tuple[list[AssignmentRecord], frozenset[EpochRef], dict[WorkerKey, tuple[int, int]]]:
        """The records, their superseded epochs and the workers' loads, taken together."""
        with self._lock:
            return list(self.records.values()), self.index.superseded(), self.index.worker_loads()

    def records_named(self, keys: str) -> list[AssignmentRecord]:
        """The records of one of the index's named sets (`failed_replicas`, `leaving`,
        `load_failed`, `sharded`, `evicted`), in key order."""
        with self._lock:
            named: set[str] = getattr(self.index, keys)
            return [self.records[k] for k in sorted(named) if k in self.records]

    def dataset_records(self, tenant: str, dataset: str) -> list[AssignmentRecord]:
        with self._lock:
            return self.index.dataset_records((tenant, dataset))

    def placeable_workers(self, takeover_open: bool) -> dict[WorkerKey, WorkerRecord]:
        """Registered workers, plus, while a new leader's takeover window is open, those that
        were registered when it took over (their leases may lapse while they look for it)."""
        with self._lock:
            return {**self._at_takeover, **self.workers} if takeover_open else dict(self.workers)

    def record(self, tenant: str, dataset: str, epoch: str) -> AssignmentRecord | None:
        return self.records.get(self.keys.assignment(tenant, dataset, epoch))

    def create_record(self, record: AssignmentRecord) -> AssignmentRecord:
        """Persist a new record; if one exists (a retry, a race), return that one instead."""
        key = self.keys.assignment(record.tenant, record.dataset, record.epoch)
        stamped = _stamped(record)
        value = stamped.to_json()
        if self.metadata.put_if_absent(key, value):
            self._cache(key, stamped, value)
            return stamped
        raw = self.metadata.get(key)
        if raw is None:
            return stamped
        existing = AssignmentRecord.from_json(raw, key)
        self._cache(key, existing, raw)
        return existing

    def _cache(self, key: str, record: AssignmentRecord | None, raw: bytes | None) -> None:
        with self._lock:
            if record is None:
                old = self.records.pop(key, None)
                self._raw.pop(key, None)
                if old is not None:
                    self.index.remove(key, old)
            elif key not in self.records or self._raw.get(key) != raw:  # the same bytes: the same record
                self.records[key], self._raw[key] = record, raw
                self.index.put(key, record)

    def update_record(self, tenant: str, dataset: str, epoch: str,
                      change: Callable[[AssignmentRecord], AssignmentRecord | None]) -> AssignmentRecord | None:
        """Apply `change` (None: leave as is) with compare-and-put until it sticks.

        The first attempt compares against the bytes this leader last saw (no read); if etcd
        holds something else (another writer), the key is read and the change applied again.
        """
        key = self.keys.assignment(tenant, dataset, epoch)
        with self._lock:
            raw = self._raw.get(key)
        for _ in range(20):
            if raw is None:
                raw = self.metadata.get(key)
                if raw is None:
                    self._cache(key, None, None)
                    return None
            current = AssignmentRecord.from_json(raw, key)
            updated = change(current)
            if updated is None or updated == current:
                self._cache(key, current, raw)
                return current
            updated = _stamped(updated)
            value = updated.to_json()
            if self.metadata.compare_and_put(key, raw, value):
                self._cache(key, updated, value)
                return updated
            raw = None
        raise MetadataError(f"{key}: 20 concurrent changes in a row; giving up this update")

    def delete_record(self, record: AssignmentRecord) -> None:
        """Forget an epoch: its record and its plan (only ever an EVICTED one)."""
        key = self.keys.assignment(record.tenant, record.dataset, record.epoch)
        plan_key = self.keys.plan(record.tenant, record.dataset, record.epoch)
        self.metadata.delete(key)
        self.metadata.delete(plan_key)
        self._plans.pop(plan_key, None)
        self._cache(key, None, None)

    def put_plan(self, plan: cp.LoadPlan) -> None:
        key = self.keys.plan(plan.tenant_id, plan.dataset_id, plan.epoch_id)
        self.metadata.put(key, encode_plan(plan))
        self._plans[key] = plan

    def get_plan(self, tenant: str, dataset: str, epoch: str) -> cp.LoadPlan | None:
        key = self.keys.plan(tenant, dataset, epoch)
        if key not in self._plans:
            raw = self.metadata.get(key)
            if raw is None:
                return None
            self._plans[key] = decode_plan(raw)
        return self._plans[key]


def _stamped(record: AssignmentRecord) -> AssignmentRecord:
    from dataclasses import replace

    now = int(time.time() * 1000)
    return replace(record, updated_ms=now, created_ms=record.created_ms or now)
