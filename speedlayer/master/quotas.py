"""Memory quotas (seed §8): a tenant's and the cluster's budgets against live epochs' estimates.

An epoch counts `estimated_memory_bytes x replication`: every replica occupies a worker's
memory. An incremental epoch whose base epoch is still held counts only what it adds (workers
share the base's tables between them). FAILED and EVICTED epochs count nothing. A sharded epoch
counts its whole estimate once, as its own (its shards' records count nothing: they are its parts). Checked before
anything of a new epoch is persisted.
"""

from __future__ import annotations

from speedlayer.errors import PreconditionError
from speedlayer.records import AssignmentRecord, GlobalConfig, TenantConfig


def footprint(record: AssignmentRecord, base: AssignmentRecord | None = None) -> int:
    """`base`: the record of `record.base_epoch`, if known."""
    if not record.live or record.shard_of:
        return 0
    size = record.estimated_memory_bytes
    if record.base_epoch and base is not None and base.live:
        size = max(0, size - base.estimated_memory_bytes)
    return size * record.replication


def usage(records: list[AssignmentRecord]) -> int:
    by_epoch = {(r.tenant, r.dataset, r.epoch): r for r in records}
    return sum(footprint(r, by_epoch.get((r.tenant, r.dataset, r.base_epoch))) for r in records)


def tenant_usage(records: list[AssignmentRecord], tenant: str) -> int:
    return usage([r for r in records if r.tenant == tenant])


def check_quotas(records: list[AssignmentRecord], tenant: str, tenant_config: TenantConfig,
                 global_config: GlobalConfig, new_bytes: int) -> None:
    """PreconditionError (FAILED_PRECONDITION) naming the budget `new_bytes` would exceed."""
    check_usage(tenant_usage(records, tenant), usage(records), tenant, tenant_config, global_config, new_bytes)


def check_usage(used: int, total: int, tenant: str, tenant_config: TenantConfig, global_config: GlobalConfig,
                new_bytes: int) -> None:
    """`check_quotas` with the tenant's and the cluster's usage known (the leader keeps them
    per change: `RecordIndex.usage`)."""
    limit = tenant_config.memory_quota_bytes
    if limit > 0 and used + new_bytes > limit:
        raise PreconditionError(
            f"tenant {tenant} memory quota exceeded: {used} bytes in use + {new_bytes} estimated "
            f"for this epoch (replicas included) > quota {limit} bytes (/tenants/{tenant}/config)"
        )
    limit = global_config.memory_quota_bytes
    if limit > 0 and total + new_bytes > limit:
        raise PreconditionError(
            f"global memory quota exceeded: {total} bytes in use + {new_bytes} estimated for this "
            f"epoch (replicas included) > quota {limit} bytes (/config/global)"
        )
