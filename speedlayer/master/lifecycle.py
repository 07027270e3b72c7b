"""The Epoch Lifecycle (seed §2, "TTL & Eviction, Refresh Scheduling"): which epochs to evict.

Pure: assignment records and the time in, evictions out; the reconciler applies them. Per
dataset the *served* epoch is the newest one with a READY replica (what queries see); epochs
older than it are *superseded*, epochs newer are in flight. Only superseded epochs are ever
evicted, so a dataset's served epoch never is. A sharded epoch is one epoch here: READY when every
shard is (`ready_shards`), and its shards go where it goes:

* TTL: a superseded epoch goes `ttl` seconds after it was superseded (the first newer epoch
  became READY; an epoch admitted explicitly keeps at least `ttl` from its admission);
* LRU within the quota: while a tenant's live epochs exceed its memory quota, the superseded
  epoch served least recently (superseded first) goes, until the tenant fits or none is left.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable

from speedlayer.master.quotas import tenant_usage
from speedlayer.records import R_READY, AssignmentRecord

TTL, LRU = "ttl", "lru"


@dataclass(frozen=True)
class Eviction:
    record: AssignmentRecord
    reason: str  # TTL or LRU
    detail: str


def by_dataset(records: Iterable[AssignmentRecord]) -> dict[tuple[str, str], list[AssignmentRecord]]:
    """Live records per (tenant, dataset), oldest first; a sharded epoch's shards are not epochs."""
    grouped: dict[tuple[str, str], list[AssignmentRecord]] = defaultdict(list)
    for record in records:
        if record.live and not record.shard_of:
            grouped[(record.tenant, record.dataset)].append(record)
    return {k: sorted(v, key=lambda r: r.order) for k, v in grouped.items()}


def has_ready(record: AssignmentRecord) -> bool:
    if record.sharded:
        return record.ready_shards >= len(record.shards)
    return any(r.state == R_READY for r in record.replicas.values())


def served_epoch(dataset_records: list[AssignmentRecord]) -> AssignmentRecord | None:
    """The newest live epoch with a READY replica: the one queries see."""
    ready = [r for r in dataset_records if r.live and has_ready(r)]
    return max(ready, key=lambda r: r.order) if ready else None


def superseded(dataset_records: list[AssignmentRecord]) -> dict[str, int]:
    """{epoch: superseded-since ms} for the epochs older than the served one."""
    served = served_epoch(dataset_records)
    if served is None:
        return {}
    found = {}
    for record in dataset_records:
        if record.order >= served.order:
            continue
        newer = [r.ready_ms for r in dataset_records if r.order > record.order and r.ready_ms > 0]
        since = min(newer) if newer else served.ready_ms
        found[record.epoch] = max(since, record.created_ms)
    return found


def superseded_keys(records: list[AssignmentRecord]) -> set[tuple[str, str, str]]:
    """(tenant, dataset, epoch) of every superseded epoch, and of the shards of superseded ones."""
    found = {(tenant, dataset, epoch) for (tenant, dataset), group in by_dataset(records).items()
             for epoch in superseded(group)}
    return found | {(r.tenant, r.dataset, r.epoch) for r in records
                    if r.shard_of and (r.tenant, r.dataset, r.shard_of) in found}


def evictions(records: list[AssignmentRecord], now_ms: int, ttl_s: Callable[[str], float],
              quota_bytes: Callable[[str], int], need_bytes: Callable[[str], int] = lambda tenant: 0) -> list[Eviction]:
    """Epochs to evict now: by TTL first, then by LRU for tenants over their quota (with
    `need_bytes` more to place: a new epoch waiting for room)."""
    chosen: list[Eviction] = []
    candidates: list[tuple[int, AssignmentRecord]] = []
    for (tenant, _), dataset_records in by_dataset(records).items():
        for epoch, since in superseded(dataset_records).items():
            record = next(r for r in dataset_records if r.epoch == epoch)
            ttl_ms = int(ttl_s(tenant) * 1000)
            if now_ms - since >= ttl_ms:
                chosen.append(Eviction(record, TTL, f"superseded {now_ms - since} ms ago (ttl {ttl_ms} ms)"))
            else:
                candidates.append((since, record))
    gone = {(e.record.tenant, e.record.dataset, e.record.epoch) for e in chosen}
    for tenant in sorted({r.tenant for _, r in candidates}):
        quota = quota_bytes(tenant)
        if quota <= 0:
            continue
        chosen += _lru(tenant, quota, [r for r in records if (r.tenant, r.dataset, r.epoch) not in gone],
                       sorted((c for c in candidates if c[1].tenant == tenant), key=lambda c: c[0]),
                       need_bytes(tenant))
    return chosen


def _lru(tenant: str, quota: int, remaining: list[AssignmentRecord], candidates: list[tuple[int, AssignmentRecord]],
         need: int) -> list[Eviction]:
    """Least recently served first, while over the quota. An epoch whose tables an increment
    still reads frees nothing alone, so epochs are taken in runs: a run is evicted only once
    it lowers the tenant's usage (a base together with the increments that share it)."""
    chosen: list[Eviction] = []
    run: list[tuple[int, AssignmentRecord]] = []
    used = tenant_usage(remaining, tenant) + need
    for since, record in candidates:
        if used <= quota:
            break
        run.append((since, record))
        left = [r for r in remaining if all(r is not c for _, c in run)]
        after = tenant_usage(left, tenant) + need
        if after < used:
            chosen += [Eviction(r, LRU, f"tenant uses {used} bytes > quota {quota}; least recently served "
                                        f"(superseded at {s} ms)") for s, r in run]
            remaining, used, run = left, after, []
    return chosen
