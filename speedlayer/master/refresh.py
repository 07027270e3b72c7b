"""Refresh scheduling (seed §2 Epoch Lifecycle): a new epoch for every new version of a followed table.

Leader only. A dataset admitted at its table's latest version follows the table
(`/tenants/{t}/datasets/{d}`). Writers that know the speed layer announce their commits
(`/announce/{t}/{d}`, written through `speedlayer.announce` by pipelines after the Delta and
cursor commits): the leader watches those keys and looks at once. For writers it does not know
it polls every followed table every `refresh_poll_interval_s` (`/config/global`): one look at
each table's log, then at the datasets of the tables that moved. An announcement is only a
hint: what an epoch holds always comes from the table's own log.

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
from dataclasses import replace
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
from speedlayer.records import ASSIGNED, EVICTED, PENDING, AssignmentRecord, DatasetSpec
from speedlayer.sources.delta import DeltaTableSource
from speedlayer.sources.delta_changes import TableChange, classify

logger = logging.getLogger(__name__)

DatasetKey = tuple[str, str]
# A PENDING epoch unchanged this long, with no admission placing it, was left by an admission
# that stopped half way: admissions write PLANNED within milliseconds, seconds under load.
STALLED_ADMISSION_S = 30.0


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
        self._polled: dict[str, int] = {}  # table URI -> the latest version a poll looked at all its datasets for
        self._failed: set[DatasetKey] = set()  # datasets whose last look raised: the next poll looks again
        self._seen: set[DatasetKey] = set()  # the datasets the last poll knew (a spec new since is looked at)
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
        """Look at the datasets due; on a poll (`all_datasets`), also at every dataset of a
        followed table whose latest version moved since the last poll (all of them on a new
        leader's first poll), and at those whose last look failed. The specs come from the
        watched `ConfigView` and each dataset's records from the leader's index: a poll at
        2,000 datasets of one unchanged table costs one look at its log, not 2,000 spec reads
        and refreshes holding the leader's GIL."""
        with self._lock:
            due, self._due = self._due, {}
        if not all_datasets and not due:
            return  # woken by a change that no dataset waits on: nothing to look at
        specs = self._config.specs() if all_datasets else self._specs_of(set(due))
        self._latest_this_pass = {}
        polled, unread = self._moved_tables(specs) if all_datasets else ({}, set())
        keys = (set(due) | {key for key, spec in specs.items() if spec.source_uri not in unread and (
            spec.source_uri in polled or key in self._failed or key not in self._seen)}) & set(specs)
        for key in sorted(keys):
            spec = specs[key]
            if not spec.follow or spec.source_type != "delta":
                continue
            self._failed.discard(key)
            try:
                waiting = self.refresh(key, spec, due.get(key, "poll"))
            except DanubeError as exc:  # a refused plan, etcd unreachable: this dataset alone
                logger.warning("refreshing %s/%s failed: %s", *key, exc, extra={"tenant_id": key[0]})
                self._failed.add(key)  # looked at again by the next poll, whether its table moved or not
                waiting = False
            if waiting:  # looked at again when its epoch in flight settles
                with self._lock:
                    self._due.setdefault(key, "loaded")
        if all_datasets:  # only once every dataset of those versions was looked at
            self._polled.update(polled)
            self._seen = {key for key, spec in specs.items() if spec.source_uri not in unread}
        self._latest_this_pass = {}  # a refresh outside a pass reads the log again

    def _moved_tables(self, specs: dict[DatasetKey, DatasetSpec]) -> tuple[dict[str, int], set[str]]:
        """`{table URI: latest version}` of the followed Delta tables whose latest version is not
        the one the last poll looked at (every table at a leader's first poll), and the tables
        whose log could not be read (their datasets wait for the next poll)."""
        uris = {spec.source_uri for spec in specs.values() if spec.follow and spec.source_type == "delta"}
        self._polled = {uri: version for uri, version in self._polled.items() if uri in uris}
        moved, unread = {}, set()
        for uri in sorted(uris):
            try:
                latest = self._latest_version(uri)
            except SpeedLayerError as exc:
                logger.warning("reading the latest version of %s failed: %s", uri, exc)
                unread.add(uri)
                continue
            if self._polled.get(uri) != latest:
                moved[uri] = latest
        return moved, unread

    def _specs_of(self, keys: set[DatasetKey]) -> dict[DatasetKey, DatasetSpec]:
        specs = {}
        for tenant, dataset in keys:
            spec = self._config.spec(tenant, dataset)
            if spec is not None:
                specs[(tenant, dataset)] = spec
        return specs

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
        if head is not None and self._stalled(head):
            self._abandon(head)
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

    def _stalled(self, head: AssignmentRecord) -> bool:
        """A PENDING epoch no admission is working on, unchanged for `STALLED_ADMISSION_S`: its
        admission stopped between the record and its plan (an etcd error, a leader that died).
        Nothing else takes a PENDING epoch on (the reconciler places PLANNED ones), so the
        dataset would wait on it for good (found by the soak, issue 43: a dataset answered its
        version 13 for the last 20 minutes of a run while its table reached version 45)."""
        if head.status != PENDING or (head.tenant, head.dataset, head.epoch) in self._state.placing_now():
            return False
        return time.time() * 1000 - head.updated_ms >= STALLED_ADMISSION_S * 1000

    def _abandon(self, head: AssignmentRecord) -> None:
        """EVICT a stalled PENDING epoch (it holds no replica): the refresh then plans the table's
        latest version again, the same epoch id re-created if it is still that version."""
        detail = (f"its admission stopped before its plan {int(time.time() - head.updated_ms / 1000)} s ago; "
                  "planned again")
        updated = self._state.update_record(
            head.tenant, head.dataset, head.epoch,
            lambda r: replace(r, status=EVICTED, message=f"evicted (stalled): {detail}") if r.status == PENDING else None)
        if updated is None or updated.status != EVICTED:
            return
        logger.warning("epoch %s of %s/%s %s", head.epoch, head.tenant, head.dataset, detail,
                       extra={"tenant_id": head.tenant, "epoch_id": head.epoch})
        self._audit.record(AuditEvent(kind="epoch.EVICTED", tenant=head.tenant, dataset=head.dataset, epoch=head.epoch,
                                      master_id=self._master_id, detail={"reason": "stalled", "detail": detail}))

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
