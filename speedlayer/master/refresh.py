"""Refresh scheduling (seed §2 Epoch Lifecycle): a new epoch for every new version of a followed table.

Leader only. A dataset admitted at its table's latest version follows the table
(`/tenants/{t}/datasets/{d}`). Writers that know the speed layer announce their commits
(`/announce/{t}/{d}`, written through `speedlayer.announce` by pipelines after the Delta and
cursor commits): the leader watches those keys and looks at once. For writers it does not know
it polls every followed table every `refresh_poll_interval_s` (`/config/global`). An
announcement is only a hint: what an epoch holds always comes from the table's own log.

At most one epoch per dataset is in flight: while the newest is still loading, newer
versions wait and are then planned together (one epoch for the latest version), so a fast
writer never queues a backlog of loads. The next epoch is incremental on the served one when
the versions in between only added files (`sources.delta_changes`), else a full rebuild loaded
beside the served epoch, which stays served until the rebuild is READY.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from danube_core.errors import DanubeError
from danube_core.metadata import WatchEvent
from danube_core.watched_thread import WatchedThread

from speedlayer.errors import PreconditionError, SpeedLayerError
from speedlayer.master.admission import AdmissionController
from speedlayer.master.lifecycle import by_dataset, served_epoch
from speedlayer.master.state import ClusterState, ConfigView
from speedlayer.observability.audit import AuditEvent, AuditLogger
from speedlayer.observability.metrics import REFRESH_LAG, REFRESHES
from speedlayer.records import ASSIGNED, EVICTED, AssignmentRecord, DatasetSpec
from speedlayer.sources.delta import DeltaTableSource
from speedlayer.sources.delta_changes import TableChange, classify

logger = logging.getLogger(__name__)

DatasetKey = tuple[str, str]


class Refresher:
    def __init__(self, state: ClusterState, config: ConfigView, delta: DeltaTableSource,
                 admission: AdmissionController, audit: AuditLogger, master_id: str,
                 make_room: Callable[[str, int], None]) -> None:
        self._state, self._config, self._delta = state, config, delta
        self._admission, self._audit, self._master_id = admission, audit, master_id
        self._make_room = make_room  # evict LRU epochs of a tenant to fit this many more bytes
        self._lock = threading.Lock()
        self._due: dict[DatasetKey, str] = {}  # dataset -> why it is looked at next ("announce", "loaded")
        self._refused: dict[DatasetKey, int] = {}  # last version refused (not retried until a newer one)
        self._latest_this_pass: dict[str, int] = {}  # table URI -> latest version, this pass
        self._parsed: dict[str, tuple[bytes, DatasetSpec]] = {}  # spec key -> (its value, parsed)
        self._loop = WatchedThread("refresh", self._run)
        self._wake, self._stop = self._loop.wake_event, self._loop.stop_event

    def start(self) -> None:
        self._loop.start(self._state.metadata, self._state.keys.announce_prefix, self._on_announce)

    def stop(self) -> None:
        self._loop.stop()

    def look_at(self, tenant: str, dataset: str, why: str) -> None:
        with self._lock:
            self._due.setdefault((tenant, dataset), why)
        self._wake.set()

    def wake(self) -> None:
        """Something moved (an epoch became READY): datasets waiting on it are looked at again."""
        self._wake.set()

    def _on_announce(self, event: WatchEvent) -> None:
        if event.value is not None:
            self.look_at(*self._state.keys.parse_announce(event.key), "announce")

    def _run(self) -> None:
        next_poll = 0.0
        while not self._stop.is_set():
            self._wake.clear()
            now = time.monotonic()
            polling = now >= next_poll
            try:
                self.run_once(all_datasets=polling)
            except DanubeError as exc:
                logger.warning("refresh pass failed, retrying: %s", exc)
            except Exception:
                logger.exception("refresh pass failed")
            if polling:
                next_poll = now + self._config.global_config.refresh_poll_interval_s
            self._wake.wait(max(0.01, next_poll - time.monotonic()))

    def run_once(self, all_datasets: bool = True) -> None:
        with self._lock:
            due, self._due = self._due, {}
        if not all_datasets and not due:
            return  # woken by a change that no dataset waits on: nothing to read
        # A poll reads every spec; a wake only the specs of the datasets due (not all of them
        # again on every change), and each pass groups the records by dataset once (a wake: only
        # the due datasets' records).
        specs = self._specs() if all_datasets else self._specs_of(set(due))
        keys = set(specs) if all_datasets else set(due) & set(specs)
        grouped: dict[DatasetKey, list[AssignmentRecord]] = {}
        if all_datasets:
            for record in self._state.snapshot()[0]:
                grouped.setdefault((record.tenant, record.dataset), []).append(record)
        else:  # the datasets due only, from the leader's index (not a scan of every record per wake)
            grouped = {key: self._state.dataset_records(*key) for key in keys}
        self._latest_this_pass = {}
        for key in sorted(keys):
            spec = specs[key]
            if not spec.follow or spec.source_type != "delta":
                continue
            try:
                waiting = self.refresh(key, spec, due.get(key, "poll"), grouped.get(key, []))
            except SpeedLayerError as exc:
                logger.warning("refreshing %s/%s failed: %s", *key, exc, extra={"tenant_id": key[0]})
                waiting = False
            if waiting:  # looked at again when its epoch in flight settles
                with self._lock:
                    self._due.setdefault(key, "loaded")
        self._latest_this_pass = {}  # a refresh outside a pass reads the log again

    def _specs(self) -> dict[DatasetKey, DatasetSpec]:
        specs, parsed = {}, {}
        for key, raw in self._state.metadata.get_prefix(self._state.keys.tenants_prefix):
            dataset = self._state.keys.parse_dataset_spec(key)
            if dataset is not None:
                spec = self._parse(key, raw)
                if spec is not None:
                    specs[dataset], parsed[key] = spec, (raw, spec)
        self._parsed = parsed  # what is no longer there is forgotten
        return specs

    def _specs_of(self, keys: set[DatasetKey]) -> dict[DatasetKey, DatasetSpec]:
        specs = {}
        for tenant, dataset in keys:
            key = self._state.keys.dataset_spec(tenant, dataset)
            raw = self._state.metadata.get(key)
            spec = self._parse(key, raw) if raw is not None else None
            if spec is not None:
                specs[(tenant, dataset)] = spec
        return specs

    def _parse(self, key: str, raw: bytes) -> DatasetSpec | None:
        """The spec `raw` holds, parsed once per value (a poll reads every spec: 2,000 at scale)."""
        known = self._parsed.get(key)
        if known is not None and known[0] == raw:
            return known[1]
        try:
            spec = DatasetSpec.from_json(raw, key)
        except DanubeError as exc:
            logger.error("ignoring %s: %s", key, exc)
            return None
        self._parsed[key] = (raw, spec)
        return spec

    def _latest_version(self, uri: str) -> int:
        """The table's latest version, read once per pass (datasets may follow one table)."""
        if uri not in self._latest_this_pass:
            self._latest_this_pass[uri] = self._delta.latest_version(uri)
        return self._latest_this_pass[uri]

    def refresh(self, key: DatasetKey, spec: DatasetSpec, trigger: str,
                records: list[AssignmentRecord] | None = None) -> bool:
        """Plan the dataset's next epoch if its table moved on. True: a newer version may exist
        but an epoch is still in flight (look again when it settles). `records`: the dataset's
        (default: read from the leader's view)."""
        tenant, dataset = key
        if records is None:
            records = self._state.dataset_records(tenant, dataset)
        live = by_dataset(records).get(key, [])
        head = live[-1] if live else None
        if head is not None and (head.status != ASSIGNED or not head.settled()):
            return True
        known = max((r.version for r in records if r.status != EVICTED), default=-1)
        known = max(known, self._refused.get(key, -1))
        latest = self._latest_version(spec.source_uri)
        if latest <= known:
            return False
        wanted = [dict(p) for p in spec.partitions]
        resolved = self._refuse_on_error(key, latest, lambda: self._delta.resolve_uri(spec.source_uri, latest, wanted))
        if resolved is None:
            return False
        base = served_epoch(live)
        plan = self._state.get_plan(tenant, dataset, base.epoch) if base is not None else None
        change = classify(plan, resolved) if plan is not None else TableChange("rebuild", "no epoch is served")
        after = plan.source.delta.version if plan is not None else -1
        detail = {"trigger": trigger, "reason": change.reason, "added_files": len(change.added),
                  "operations": self._delta.operations(spec.source_uri, after, latest)}
        record = self._plan(key, spec, resolved, base, change, detail)
        if record is not None:
            self._planned(record, change, resolved.source.delta.commit_timestamp_ms)
        return False

    def _plan(self, key: DatasetKey, spec: DatasetSpec, resolved, base: AssignmentRecord | None,
              change: TableChange, detail: dict) -> AssignmentRecord | None:
        tenant, dataset = key
        try:
            return self._admission.plan_refresh(tenant, dataset, spec, resolved, base, change, detail)
        except PreconditionError:
            # Over quota: superseded epochs go first (LRU), then one more try.
            self._make_room(tenant, int(resolved.total_bytes * self._config.global_config.memory_expansion_factor))
        return self._refuse_on_error(key, resolved.version, lambda: self._admission.plan_refresh(
            tenant, dataset, spec, resolved, base, change, detail))

    def _refuse_on_error(self, key: DatasetKey, version: int, action: Callable):
        try:
            return action()
        except PreconditionError as exc:
            if self._refused.get(key) != version:
                self._refused[key] = version
                logger.warning("version %d of %s/%s not loaded: %s", version, *key, exc, extra={"tenant_id": key[0]})
                self._audit.record(AuditEvent(kind="refresh.refused", tenant=key[0], dataset=key[1],
                                              master_id=self._master_id,
                                              detail={"version": version, "reason": str(exc)}))
            return None

    def _planned(self, record: AssignmentRecord, change: TableChange, commit_ms: int) -> None:
        REFRESHES.labels(kind=record.kind).inc()
        if commit_ms > 0:
            REFRESH_LAG.observe(max(0.0, time.time() - commit_ms / 1000))
        logger.info("%s epoch %s of %s/%s for version %d%s", record.kind, record.epoch, record.tenant,
                    record.dataset, record.version,
                    f" (+{len(change.added)} files on {record.base_epoch})" if record.base_epoch else
                    f" (rebuild: {change.reason})",
                    extra={"tenant_id": record.tenant, "dataset_id": record.dataset, "epoch_id": record.epoch})
