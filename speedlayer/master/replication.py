"""An epoch's replication: what it lacks, said so that whoever reads `status` can act on it.

Replication (replicas per epoch, each on a worker of its own) is chosen when an epoch is
created: the admission's `replication` (`admin admit --replication N`; a followed dataset's
later epochs keep it), else the tenant's `replication_factor` (`/tenants/{t}/config`), else the
cluster's (`/config/global`, default 2). Admitting the same table version again with an
explicit `--replication` changes the epoch's (`with_replication`).

Pure: records and worker counts in, records and text out.
"""

from __future__ import annotations

from dataclasses import replace

from speedlayer.records import ASSIGNED, PLANNED, R_READY, AssignmentRecord, GlobalConfig

DEFAULT_REPLICATION = GlobalConfig().replication_factor


def how_to_set(tenant: str, replication: int | None = None) -> str:
    """Where replication is set, for a message."""
    n = replication if replication is not None else "N"
    return (f"admit it again with --replication {n} (this dataset, its later epochs too), or set "
            f"replication_factor={n} in /tenants/{tenant}/config (the tenant's new epochs) or in /config/global "
            f"(every tenant's; default {DEFAULT_REPLICATION})")


def capacity(record: AssignmentRecord, free: dict[str, int]) -> str:
    """What a replica of `record` needs against what the tenant's workers have free ("" when
    `free`, worker -> free bytes of those reporting a capacity, is empty)."""
    if not free:
        return ""
    shown = ", ".join(f"{w} {b}" for w, b in sorted(free.items(), key=lambda x: (-x[1], x[0]))[:8])
    return (f"capacity: a replica needs {record.estimated_memory_bytes} bytes, the most any worker has free is "
            f"{max(free.values())} bytes (free: {shown}{', ...' if len(free) > 8 else ''})")


def shortfall(record: AssignmentRecord, workers: int, free: dict[str, int] | None = None) -> str:
    """Why `record` has fewer replicas than its replication and what to do ("" when it has them
    all, or is not being placed). `workers`: how many workers of its tenant are registered;
    `free`: their free memory, to say capacity needed against capacity free."""
    placed, wanted, tenant = len(record.staying()), record.replication, record.tenant
    if record.status not in (PLANNED, ASSIGNED) or placed >= wanted or record.sharded:
        return ""
    start = f"start a worker of tenant {tenant} (python -m speedlayer worker --tenant {tenant} --masters ...)"
    if workers == 0:
        return f"no eligible worker of tenant {tenant} yet (none registered); assigned when one registers: {start}"
    room = capacity(record, free or {})
    if placed == 0:
        return (f"no eligible worker of tenant {tenant} among its {workers} registered: draining, short of "
                f"memory for the epoch's estimated {record.estimated_memory_bytes} bytes, or its load failed "
                f"there (see replicas); {start}" + (f"; {room}" if room else ""))
    if workers > placed:
        return (f"{placed} of {wanted} replicas placed: tenant {tenant}'s other workers are draining, short of "
                f"memory for the epoch's estimated {record.estimated_memory_bytes} bytes, or its load failed "
                f"there (see replicas); for fewer replicas, {how_to_set(tenant)}")
    return (f"{placed} of {wanted} replicas placed: tenant {tenant} has {workers} worker(s) and each replica "
            f"needs one of its own; for {wanted}, start {wanted - workers} more worker(s) of tenant {tenant}; "
            f"for {workers}, {how_to_set(tenant, workers)}")


def with_replication(record: AssignmentRecord, replication: int) -> AssignmentRecord:
    """`record` wanting `replication` replicas. Replicas beyond it go, those still loading first;
    a READY one is marked `leaving` and dropped once the others are settled (make before break)."""
    staying = sorted(record.staying(), key=lambda w: (record.replicas[w].state == R_READY, w))
    replicas = dict(record.replicas)
    for worker in staying[:max(0, len(staying) - replication)]:
        if replicas[worker].state == R_READY:
            replicas[worker] = replace(replicas[worker], leaving=True)
        else:
            del replicas[worker]
    return replace(record, replication=replication, replicas=replicas)
