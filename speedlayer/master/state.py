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
from contextlib import contextmanager
from typing import Callable, Iterator

from danube_core.errors import MetadataError
from danube_core.metadata import MetadataStore, WatchEvent, WatchHandle

from speedlayer.api.v1 import control_plane_service_pb2 as cp
from speedlayer.keys import SpeedLayerKeys
from speedlayer.master.record_index import EpochRef, RecordIndex, StatusCounts
from speedlayer.observability.metrics import WORKERS_LOST
from speedlayer.records import AssignmentRecord, DatasetSpec, GlobalConfig, TenantConfig, WorkerRecord

logger = logging.getLogger(__name__)

WorkerKey = tuple[str, str]  # (tenant, worker)
DatasetKey = tuple[str, str]  # (tenant, dataset)
Companions = tuple[tuple[str, bytes], ...]  # keys written in one transaction with a record


class ConfigView:
    """`/config/global` and `/tenants/*/config`, hot-reloaded through watches (seed §14), and
    the followed datasets' specs (`/tenants/*/datasets/*`), which the same watch delivers: the
    refresher and admission read those from here instead of etcd (at 2,000 datasets a poll read
    them all every `refresh_poll_interval_s`, and every admission read its own back)."""

    def __init__(self, metadata: MetadataStore, keys: SpeedLayerKeys,
                 on_change: Callable[[], None] = lambda: None) -> None:
        self._metadata, self._keys, self._on_change = metadata, keys, on_change
        self.global_config = GlobalConfig()
        self.tenants: dict[str, TenantConfig] = {}
        self._specs: dict[DatasetKey, tuple[bytes, DatasetSpec]] = {}  # (value as written, parsed)
        self._specs_lock = threading.Lock()
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

    def read_tenant(self, tenant: str) -> TenantConfig:
        """`tenant`'s config as etcd holds it now (one read), applied here too: an admission
        sees every config change written before it, where the watch may deliver it a moment
        later (an operator who sets a tenant's quota or namespaces, then admits, gets them)."""
        key = self._keys.tenant_config(tenant)
        if self._apply(WatchEvent("put" if (raw := self._metadata.get(key)) is not None else "delete", key, raw)):
            self._on_change()
        return self.tenant(tenant)

    def specs(self) -> dict[DatasetKey, DatasetSpec]:
        """Every dataset spec, as last written (by this master or seen through the watch)."""
        with self._specs_lock:
            return {key: spec for key, (_, spec) in self._specs.items()}

    def spec(self, tenant: str, dataset: str) -> DatasetSpec | None:
        with self._specs_lock:
            known = self._specs.get((tenant, dataset))
        return known[1] if known is not None else None

    def wrote_spec(self, tenant: str, dataset: str, spec: DatasetSpec) -> None:
        """This master just wrote `spec`: readers here see it before the watch brings it back."""
        raw = spec.to_json()
        with self._specs_lock:
            self._specs[(tenant, dataset)] = (raw, spec)

    def _on_event(self, event: WatchEvent) -> None:
        if self._apply(event):
            self._on_change()

    def _apply(self, event: WatchEvent) -> bool:
        """Apply one change; False for a dataset spec (it moves no epoch: the refresher reads
        specs when it looks, nothing needs waking)."""
        dataset = self._keys.parse_dataset_spec(event.key) if event.key.startswith(self._keys.tenants_prefix) else None
        if dataset is not None:
            self._apply_spec(dataset, event)
            return False
        try:
            if event.key == self._keys.global_config:
                self.global_config = (GlobalConfig.from_json(event.value, event.key)
                                      if event.value is not None else GlobalConfig())
                logger.info("global config now %s", self.global_config)
                logging.getLogger().setLevel(self.global_config.log_level.upper())
            elif event.key.endswith("/config") and event.key.count("/", len(self._keys.tenants_prefix)) == 1:
                tenant = event.key[len(self._keys.tenants_prefix):-len("/config")]
                config = TenantConfig.from_json(event.value, event.key) if event.value is not None else None
                if config == self.tenants.get(tenant):
                    return False  # read already (`read_tenant`), or written again unchanged
                if config is None:
                    self.tenants.pop(tenant, None)
                else:
                    self.tenants[tenant] = config
                logger.info("tenant %s config now %s", tenant, config, extra={"tenant_id": tenant})
        except (MetadataError, ValueError) as exc:  # a bad edit keeps the last good config
            logger.error("ignoring config change at %s: %s", event.key, exc)
        return True

    def _apply_spec(self, dataset: DatasetKey, event: WatchEvent) -> None:
        if event.value is None:
            with self._specs_lock:
                self._specs.pop(dataset, None)
            return
        with self._specs_lock:
            known = self._specs.get(dataset)
        if known is not None and known[0] == event.value:
            return  # this master's own write coming back
        try:
            spec = DatasetSpec.from_json(event.value, event.key)
        except MetadataError as exc:  # a bad edit: the dataset is not followed until fixed
            logger.error("ignoring %s: %s", event.key, exc)
            with self._specs_lock:
                self._specs.pop(dataset, None)
            return
        with self._specs_lock:
            self._specs[dataset] = (event.value, spec)


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
        self._placing: set[EpochRef] = set()  # epochs an admission is placing right now

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
        """`RecordIndex.placement_counts` and `RecordIndex.short`, taken together; `short`
        without the epochs an admission is placing (`placing`)."""
        with self._lock:
            return self.index.placement_counts(), [r for r in self.index.short()
                                                   if (r.tenant, r.dataset, r.epoch) not in self._placing]

    @contextmanager
    def placing(self, refs: list[EpochRef]) -> Iterator[None]:
        """An admission places `refs` itself meanwhile (PLANNED, no replica yet): a reconciliation
        pass leaves them alone instead of running a full placement for them (O(epochs), holding
        the GIL while the admission waits) and racing the admission's own write. If the
        admission fails, the caller wakes the reconciler, which places what it left PLANNED."""
        with self._lock:
            self._placing.update(refs)
        try:
            yield
        finally:
            with self._lock:
                self._placing.difference_update(refs)

    def placing_now(self) -> frozenset[EpochRef]:
        with self._lock:
            return frozenset(self._placing)

    def take_desired(self) -> dict[WorkerKey, dict[str, AssignmentRecord]]:
        """What each worker whose epochs changed since the last call should hold (one caller:
        the reconciler's loop)."""
        with self._lock:
            return self.index.take_desired()

    def desired_of(self, key: WorkerKey) -> dict[str, AssignmentRecord]:
        """What one worker should hold (`RecordIndex.desired_of`)."""
        with self._lock:
            return self.index.desired_of(key)

    def records_on(self, key: WorkerKey) -> list[AssignmentRecord]:
        """The records with a replica on one worker (`RecordIndex.records_on`)."""
        with self._lock:
            return self.index.records_on(key)

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

    def create_record(self, record: AssignmentRecord, also: Companions = ()) -> AssignmentRecord:
        """Persist a new record; if one exists (a retry, a race), return that one instead.
        `also`: keys written with it in one transaction (on their own if it exists)."""
        key = self.keys.assignment(record.tenant, record.dataset, record.epoch)
        stamped = _stamped(record)
        value = stamped.to_json()
        if self._write(key, None, value, also):
            self._cache(key, stamped, value)
            return stamped
        self.put_all(also)
        raw = self.metadata.get(key)
        if raw is None:
            return stamped
        existing = AssignmentRecord.from_json(raw, key)
        self._cache(key, existing, raw)
        return existing

    def _cache(self, key: str, record: AssignmentRecord, raw: bytes) -> None:
        with self._lock:
            if key not in self.records or self._raw.get(key) != raw:  # the same bytes: the same record
                self.records[key], self._raw[key] = record, raw
                self.index.put(key, record)

    def _uncache(self, key: str) -> None:
        with self._lock:
            old = self.records.pop(key, None)
            self._raw.pop(key, None)
            if old is not None:
                self.index.remove(key, old)

    def update_record(self, tenant: str, dataset: str, epoch: str,
                      change: Callable[[AssignmentRecord], AssignmentRecord | None],
                      also: Companions = ()) -> AssignmentRecord | None:
        """Apply `change` (None: leave as is) with compare-and-put until it sticks.

        The first attempt compares against the bytes this leader last saw (no read); if etcd
        holds something else (another writer), the key is read and the change applied again.
        `also`: keys written in the same transaction as the change (on their own when there
        is nothing to change): each is written whatever the record holds.
        """
        key = self.keys.assignment(tenant, dataset, epoch)
        with self._lock:
            raw = self._raw.get(key)
        for _ in range(20):
            if raw is None:
                raw = self.metadata.get(key)
                if raw is None:
                    self._uncache(key)
                    self.put_all(also)
                    return None
            current = AssignmentRecord.from_json(raw, key)
            updated = change(current)
            if updated is None or updated == current:
                self._cache(key, current, raw)
                self.put_all(also)
                return current
            updated = _stamped(updated)
            value = updated.to_json()
            if self._write(key, raw, value, also):
                self._cache(key, updated, value)
                return updated
            raw = None
        raise MetadataError(f"{key}: 20 concurrent changes in a row; giving up this update")

    def update_existing(self, tenant: str, dataset: str, epoch: str,
                        change: Callable[[AssignmentRecord], AssignmentRecord | None],
                        also: Companions = ()) -> AssignmentRecord:
        """`update_record` of a record the caller has just read or written; MetadataError if it
        was deleted meanwhile (only EVICTED records are, after their retention)."""
        updated = self.update_record(tenant, dataset, epoch, change, also)
        if updated is None:
            raise MetadataError(f"{self.keys.assignment(tenant, dataset, epoch)}: deleted while being changed")
        return updated

    def _write(self, key: str, expected: bytes | None, value: bytes, also: Companions) -> bool:
        if also:
            return self.metadata.compare_and_put_with(key, expected, value, list(also))
        if expected is None:
            return self.metadata.put_if_absent(key, value)
        return self.metadata.compare_and_put(key, expected, value)

    def put_all(self, also: Companions) -> None:
        """Write each of `also` on its own."""
        for other, value in also:
            self.metadata.put(other, value)

    def delete_record(self, record: AssignmentRecord) -> None:
        """Forget an epoch: its record and its plan (only ever an EVICTED one)."""
        key = self.keys.assignment(record.tenant, record.dataset, record.epoch)
        plan_key = self.keys.plan(record.tenant, record.dataset, record.epoch)
        self.metadata.delete(key)
        self.metadata.delete(plan_key)
        self._plans.pop(plan_key, None)
        self._uncache(key)

    def put_plan(self, plan: cp.LoadPlan) -> None:
        self.metadata.put(*self.plan_write(plan))

    def plan_write(self, plan: cp.LoadPlan) -> tuple[str, bytes]:
        """The (key, value) that persists `plan`, for a caller writing it with its record
        (`update_record(also=...)`); kept here as written (plans are immutable, their epoch's id
        names them)."""
        key = self.keys.plan(plan.tenant_id, plan.dataset_id, plan.epoch_id)
        self._plans[key] = plan
        return key, encode_plan(plan)

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
