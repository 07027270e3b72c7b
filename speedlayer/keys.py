"""Every etcd key of the speed layer (seed 002 §13), in one place.

All keys live under an optional root (default empty, i.e. the seed's layout at `/`), so that
test clusters or several speed layers can share one etcd:

    {root}/masters/{master_id}                       -> {"address": "host:port"} (leased)
    {root}/election/master                           -> master id (leased)
    {root}/workers/{tenant}/{worker}                 -> WorkerRecord (leased, kept alive by heartbeats)
    {root}/assignments/{tenant}/{dataset}/{epoch}    -> AssignmentRecord
    {root}/plans/{tenant}/{dataset}/{epoch}          -> LoadPlan protobuf bytes (immutable; extension:
                                                        kept out of the record so that status updates
                                                        do not rewrite a plan of thousands of files)
    {root}/requests/{tenant}/{request_id}            -> epoch id (idempotency keys)
    {root}/drain/{tenant}/{worker}                   -> "1" while a worker is asked to drain
    {root}/tenants/{tenant}/config                   -> TenantConfig
    {root}/tenants/{tenant}/datasets/{dataset}       -> DatasetSpec (what a dataset follows)
    {root}/announce/{tenant}/{dataset}               -> Announcement (a writer's last commit; extension)
    {root}/config/global                             -> GlobalConfig
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


def valid_id(value: str) -> bool:
    """Tenant, dataset, worker and epoch ids: 1-128 of [A-Za-z0-9_.-], not starting with . - _."""
    return bool(_ID.match(value or ""))


@dataclass(frozen=True)
class SpeedLayerKeys:
    """The key layout under `root` ("" or "/something", no trailing slash)."""

    root: str = ""

    def __post_init__(self) -> None:
        if self.root and (not self.root.startswith("/") or self.root.endswith("/")):
            raise ValueError(f"key root {self.root!r}: expected '' or '/name' without a trailing slash")

    @property
    def masters_prefix(self) -> str:
        return f"{self.root}/masters/"

    def master(self, master_id: str) -> str:
        return f"{self.masters_prefix}{master_id}"

    @property
    def election(self) -> str:
        return f"{self.root}/election/master"

    @property
    def workers_prefix(self) -> str:
        return f"{self.root}/workers/"

    def tenant_workers_prefix(self, tenant: str) -> str:
        return f"{self.workers_prefix}{tenant}/"

    def worker(self, tenant: str, worker: str) -> str:
        return f"{self.tenant_workers_prefix(tenant)}{worker}"

    def parse_worker(self, key: str) -> tuple[str, str]:
        tenant, _, worker = key[len(self.workers_prefix):].partition("/")
        return tenant, worker

    @property
    def assignments_prefix(self) -> str:
        return f"{self.root}/assignments/"

    def tenant_assignments_prefix(self, tenant: str) -> str:
        return f"{self.assignments_prefix}{tenant}/"

    def dataset_assignments_prefix(self, tenant: str, dataset: str) -> str:
        return f"{self.tenant_assignments_prefix(tenant)}{dataset}/"

    def assignment(self, tenant: str, dataset: str, epoch: str) -> str:
        return f"{self.dataset_assignments_prefix(tenant, dataset)}{epoch}"

    def plan(self, tenant: str, dataset: str, epoch: str) -> str:
        return f"{self.root}/plans/{tenant}/{dataset}/{epoch}"

    def request(self, tenant: str, request_id: str) -> str:
        return f"{self.root}/requests/{tenant}/{request_id}"

    @property
    def drain_prefix(self) -> str:
        return f"{self.root}/drain/"

    def drain(self, tenant: str, worker: str) -> str:
        return f"{self.drain_prefix}{tenant}/{worker}"

    @property
    def tenants_prefix(self) -> str:
        return f"{self.root}/tenants/"

    def tenant_prefix(self, tenant: str) -> str:
        return f"{self.tenants_prefix}{tenant}/"

    def tenant_config(self, tenant: str) -> str:
        return f"{self.tenant_prefix(tenant)}config"

    def datasets_prefix(self, tenant: str) -> str:
        return f"{self.tenants_prefix}{tenant}/datasets/"

    def dataset_spec(self, tenant: str, dataset: str) -> str:
        return f"{self.datasets_prefix(tenant)}{dataset}"

    def parse_dataset_spec(self, key: str) -> tuple[str, str] | None:
        """(tenant, dataset) of a `/tenants/{t}/datasets/{d}` key, None for any other key."""
        parts = key[len(self.tenants_prefix):].split("/")
        return (parts[0], parts[2]) if len(parts) == 3 and parts[1] == "datasets" else None

    @property
    def announce_prefix(self) -> str:
        return f"{self.root}/announce/"

    def announce(self, tenant: str, dataset: str) -> str:
        return f"{self.announce_prefix}{tenant}/{dataset}"

    def parse_announce(self, key: str) -> tuple[str, str]:
        tenant, _, dataset = key[len(self.announce_prefix):].partition("/")
        return tenant, dataset

    @property
    def global_config(self) -> str:
        return f"{self.root}/config/global"
