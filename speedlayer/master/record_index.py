"""What the leader derives from its assignment records, kept current per record change.

Admission and every reconciliation pass used to rebuild these from all the records (each an
O(epochs) scan in Python: at 2,000 epochs, the admission's candidates and quotas twice over, and
most of a pass's 120 ms). `ClusterState` now hands every change of a record (load, create,
update, delete) to one `RecordIndex`, which adjusts what that record and the records depending
on it contribute:

* `worker_loads`: (tenant, worker) -> (bytes, replicas) of the live epochs placed there, as
  `worker_loads_of` computes from scratch (the placement candidates' `assigned_bytes` and
  `epoch_count`);
* `usage`: a tenant's and the cluster's memory in use, as `quotas.usage` computes;
* `epoch_counts`: (tenant, dataset, status) -> epochs, and the same for shards, as
  `epoch_counts` computes (the `master_epochs` gauges);
* `superseded`: the superseded epochs (and their shards), as `lifecycle.superseded_keys`;
* `placement_counts` and `short`: per worker, the epochs placement places that stay on it, and
  those epochs short of replicas (a pass with nothing to place skips `next_placement`);
* `take_desired`: `DesiredEpochs.of_worker` of the workers whose epochs changed since the
  last call (the reconciler keeps the rest from its earlier passes); `desired_of` and
  `records_on`: one worker's (a worker registering or connecting: not a scan of every record
  for each of 100 workers reconnecting to a new leader);
* the few records a pass must look at by name: with a FAILED or leaving replica, with load
  failures, sharded epochs and shards, EVICTED ones.

An incremental epoch's footprint depends on its base epoch's record, so a change of a record
also recomputes the records naming it as their base; superseded epochs are a property of a
dataset, recomputed from that dataset's records alone. Must hold (tests/unit/test_record_index.py):
after any sequence of changes, every figure equals its from-scratch computation over the
records as they now are.
"""

from __future__ import annotations

from typing import Iterable

from speedlayer.master.lifecycle import superseded_keys
from speedlayer.master.quotas import footprint
from speedlayer.records import (
    ASSIGNED, EVICTED, FAILED, PENDING, PLANNED, R_FAILED, AssignmentRecord,
)

WorkerKey = tuple[str, str]  # (tenant, worker)
EpochRef = tuple[str, str, str]  # (tenant, dataset, epoch)
DatasetKey = tuple[str, str]
StatusCounts = dict[tuple[str, str, str], int]

EPOCH_STATUSES = (PENDING, PLANNED, ASSIGNED, FAILED, EVICTED)


def epoch_counts(records: Iterable[AssignmentRecord]) -> StatusCounts:
    """(tenant, dataset, status) -> epochs, every status of a dataset present (zeros included),
    so a dataset's FAILED count drops to 0 rather than vanishing when the epoch is retired.
    Pass the epochs' records or the shards' (a sharded epoch's shards are not epochs)."""
    records = list(records)
    counts: StatusCounts = {}
    for tenant, dataset in {(r.tenant, r.dataset) for r in records}:
        counts.update({(tenant, dataset, status): 0 for status in EPOCH_STATUSES})
    for record in records:
        key = (record.tenant, record.dataset, record.status)
        counts[key] = counts.get(key, 0) + 1
    return counts


def _shares(record: AssignmentRecord, base: AssignmentRecord | None) -> tuple[int, int]:
    """(quota footprint, bytes per replica on its workers) of a live record."""
    size = footprint(record, base)
    share = record.estimated_memory_bytes if record.shard_of else size // max(1, record.replication)
    return size, share


def worker_loads_of(records: list[AssignmentRecord]) -> dict[WorkerKey, tuple[int, int]]:
    """(tenant, worker) -> (bytes, replicas) of the live records placed there, from scratch.
    A shard's memory is its own (quotas count it with its epoch)."""
    loads: dict[WorkerKey, tuple[int, int]] = {}
    by_epoch = {(r.tenant, r.dataset, r.epoch): r for r in records}
    for record in records:
        if record.live:
            _, share = _shares(record, by_epoch.get((record.tenant, record.dataset, record.base_epoch)))
            for worker in record.replicas:
                size, count = loads.get((record.tenant, worker), (0, 0))
                loads[(record.tenant, worker)] = (size + share, count + 1)
    return loads


class RecordIndex:
    """Not thread-safe on its own: `ClusterState` calls it under its lock."""

    def __init__(self) -> None:
        self._records: dict[EpochRef, AssignmentRecord] = {}
        self._dependents: dict[EpochRef, set[EpochRef]] = {}  # base epoch -> increments naming it
        self._by_dataset: dict[DatasetKey, set[EpochRef]] = {}
        # What each live record adds to the sums below (tenant, footprint, share, workers).
        self._applied: dict[EpochRef, tuple[str, int, int, tuple[str, ...]]] = {}
        self._loads: dict[WorkerKey, list[int]] = {}
        self._tenant_used: dict[str, int] = {}
        self._total_used = 0
        self._counts: tuple[StatusCounts, StatusCounts] = ({}, {})  # epochs, shards
        self._dataset_sizes: tuple[dict[DatasetKey, int], dict[DatasetKey, int]] = ({}, {})
        self._superseded_of: dict[DatasetKey, frozenset[EpochRef]] = {}
        self._superseded: set[EpochRef] = set()
        # Records a pass looks at by name (etcd keys).
        self.failed_replicas: set[str] = set()
        self.leaving: set[str] = set()
        self.load_failed: set[str] = set()
        self.sharded: set[str] = set()  # sharded epochs and shards
        self.evicted: set[str] = set()
        self.generation = 0  # bumped by every change: a pass seeing the same number saw the same records
        self.counts_generation = 0  # bumped when `epoch_counts` may have changed
        # Placement's view: the epochs it places (PLANNED or ASSIGNED, not sharded, not
        # superseded), each with the workers it stays on, their count per worker, and those
        # with fewer staying replicas than their replication.
        self._placed: dict[EpochRef, tuple[str, tuple[str, ...]]] = {}
        self._placement_counts: dict[WorkerKey, int] = {}
        self._short: set[EpochRef] = set()
        # What each worker should hold: the live records with a replica (leaving or not) on it,
        # and the workers whose set or records changed since `take_desired` last looked.
        self._desired: dict[WorkerKey, set[EpochRef]] = {}
        self._dirty_workers: set[WorkerKey] = set()
        self._on_worker: dict[WorkerKey, set[EpochRef]] = {}  # every record (any status) with a replica there

    def put(self, key: str, record: AssignmentRecord) -> None:
        """`record` is now what `key` holds."""
        self._change(key, (record.tenant, record.dataset, record.epoch), record)

    def remove(self, key: str, record: AssignmentRecord) -> None:
        """`key` (which held `record`) is deleted."""
        self._change(key, (record.tenant, record.dataset, record.epoch), None)

    def _change(self, key: str, ref: EpochRef, record: AssignmentRecord | None) -> None:
        old = self._records.get(ref)
        if old is record:
            return
        self.generation += 1
        if old is None or record is None or (old.status, bool(old.shard_of)) != (record.status, bool(record.shard_of)):
            self.counts_generation += 1
        for previous, sign in ((old, -1), (record, 1)):
            if previous is not None:
                self._hold(ref, previous, sign)
        if old is not None:
            self._count(old, -1)
            self._names(key, old, False)
            self._unlink(ref, old.base_epoch)
        if record is None:
            self._records.pop(ref, None)
            self._by_dataset.get(ref[:2], set()).discard(ref)
        else:
            self._records[ref] = record
            self._by_dataset.setdefault(ref[:2], set()).add(ref)
            if record.base_epoch:
                self._dependents.setdefault((*ref[:2], record.base_epoch), set()).add(ref)
            self._count(record, 1)
            self._names(key, record, True)
        for affected in (ref, *sorted(self._dependents.get(ref, ()))):
            self._reapply(affected)
        self._resupersede(ref[:2])
        for affected in {ref, *self._by_dataset.get(ref[:2], ())}:  # superseded is the dataset's
            self._place(affected)

    def _hold(self, ref: EpochRef, record: AssignmentRecord, sign: int) -> None:
        """Add (sign 1) or take (-1) `record` to or from what its workers should hold."""
        for worker in record.replicas:
            key = (record.tenant, worker)
            self._dirty_workers.add(key)
            on_worker = self._on_worker.setdefault(key, set())
            (on_worker.add if sign > 0 else on_worker.discard)(ref)
            if not on_worker:
                del self._on_worker[key]
            if not record.live:
                continue
            if sign > 0:
                self._desired.setdefault(key, set()).add(ref)
            else:
                held = self._desired.get(key, set())
                held.discard(ref)
                if not held:
                    self._desired.pop(key, None)

    def _place(self, ref: EpochRef) -> None:
        placed = self._placed.pop(ref, None)
        if placed is not None:
            for worker in placed[1]:
                key = (placed[0], worker)
                self._placement_counts[key] -= 1
                if not self._placement_counts[key]:
                    del self._placement_counts[key]
        self._short.discard(ref)
        record = self._records.get(ref)
        if (record is None or record.status not in (PLANNED, ASSIGNED) or record.sharded
                or ref in self._superseded_of.get(ref[:2], ())):
            return
        staying = record.staying()
        self._placed[ref] = (record.tenant, staying)
        for worker in staying:
            self._placement_counts[(record.tenant, worker)] = self._placement_counts.get((record.tenant, worker), 0) + 1
        if len(staying) < record.replication:
            self._short.add(ref)

    def _unlink(self, ref: EpochRef, base_epoch: str) -> None:
        if not base_epoch:
            return
        base = (ref[0], ref[1], base_epoch)
        dependents = self._dependents.get(base)
        if dependents is not None:
            dependents.discard(ref)
            if not dependents:
                del self._dependents[base]

    # --- the sums -------------------------------------------------------------------------

    def _reapply(self, ref: EpochRef) -> None:
        applied = self._applied.pop(ref, None)
        if applied is not None:
            self._add(*applied, sign=-1)
        record = self._records.get(ref)
        if record is None or not record.live:
            return
        size, share = _shares(record, self._records.get((record.tenant, record.dataset, record.base_epoch)))
        applied = (record.tenant, size, share, tuple(record.replicas))
        self._applied[ref] = applied
        self._add(*applied, sign=1)

    def _add(self, tenant: str, size: int, share: int, workers: tuple[str, ...], sign: int) -> None:
        self._tenant_used[tenant] = self._tenant_used.get(tenant, 0) + sign * size
        if not self._tenant_used[tenant]:
            del self._tenant_used[tenant]
        self._total_used += sign * size
        for worker in workers:
            load = self._loads.setdefault((tenant, worker), [0, 0])
            load[0] += sign * share
            load[1] += sign
            if load[1] == 0:
                del self._loads[(tenant, worker)]

    def _count(self, record: AssignmentRecord, sign: int) -> None:
        kind = 1 if record.shard_of else 0
        counts, sizes = self._counts[kind], self._dataset_sizes[kind]
        dataset = (record.tenant, record.dataset)
        if sign > 0 and not sizes.get(dataset):
            counts.update({(*dataset, status): 0 for status in EPOCH_STATUSES})
        sizes[dataset] = sizes.get(dataset, 0) + sign
        key = (*dataset, record.status)
        counts[key] = counts.get(key, 0) + sign
        if not sizes[dataset]:
            del sizes[dataset]
            for status in {*EPOCH_STATUSES, record.status}:
                counts.pop((*dataset, status), None)

    def _names(self, key: str, record: AssignmentRecord, present: bool) -> None:
        replicas = record.replicas.values()
        for named, wanted in ((self.failed_replicas, any(r.state == R_FAILED for r in replicas)),
                              (self.leaving, any(r.leaving for r in replicas)),
                              (self.load_failed, bool(record.load_failures)),
                              (self.sharded, bool(record.shards or record.shard_of)),
                              (self.evicted, record.status == EVICTED)):
            if present and wanted:
                named.add(key)
            else:
                named.discard(key)

    def _resupersede(self, dataset: DatasetKey) -> None:
        refs = self._by_dataset.get(dataset)
        if not refs:
            self._by_dataset.pop(dataset, None)
        found = frozenset(superseded_keys([self._records[r] for r in refs])) if refs else frozenset()
        previous = self._superseded_of.pop(dataset, frozenset())
        if found:
            self._superseded_of[dataset] = found
        if found != previous:
            self._superseded -= previous
            self._superseded |= found

    # --- what callers read (copies: the index changes under them) ---------------------------

    def worker_loads(self) -> dict[WorkerKey, tuple[int, int]]:
        return {key: (load[0], load[1]) for key, load in self._loads.items()}

    def usage(self, tenant: str) -> tuple[int, int]:
        """(the tenant's, the cluster's) memory in use, as `quotas` counts it."""
        return self._tenant_used.get(tenant, 0), self._total_used

    def epoch_counts(self) -> tuple[StatusCounts, StatusCounts]:
        return dict(self._counts[0]), dict(self._counts[1])

    def superseded(self) -> frozenset[EpochRef]:
        return frozenset(self._superseded)

    def placement_counts(self) -> dict[WorkerKey, int]:
        """(tenant, worker) -> the placed epochs (PLANNED or ASSIGNED, not sharded, not
        superseded) staying on it: what placement's balancing counts."""
        return dict(self._placement_counts)

    def short(self) -> list[AssignmentRecord]:
        """The placed epochs with fewer staying replicas than their replication."""
        return [self._records[r] for r in sorted(self._short)]

    def take_desired(self) -> dict[WorkerKey, dict[str, AssignmentRecord]]:
        """`DesiredEpochs.of_worker` of every worker whose epochs changed since the last call
        (empty: it should hold nothing now), and forget them."""
        changed = {key: self.desired_of(key) for key in self._dirty_workers}
        self._dirty_workers = set()
        return changed

    def desired_of(self, key: WorkerKey) -> dict[str, AssignmentRecord]:
        """`DesiredEpochs.of_worker(key)`: the live epochs with a replica on the worker, oldest first."""
        held = sorted((self._records[r] for r in self._desired.get(key, ())), key=lambda r: (r.order, r.dataset))
        return {f"{r.dataset}/{r.epoch}": r for r in held}

    def records_on(self, key: WorkerKey) -> list[AssignmentRecord]:
        """The records (any status) with a replica, leaving or not, on the worker, in key order."""
        return [self._records[r] for r in sorted(self._on_worker.get(key, ()))]

    def dataset_records(self, dataset: DatasetKey) -> list[AssignmentRecord]:
        return [self._records[r] for r in self._by_dataset.get(dataset, ())]
