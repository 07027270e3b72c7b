"""`AssignmentStrategy` (seed §12): which of a tenant's workers get the replicas of an epoch.

Pure code, no I/O. Every strategy sees only `eligible` candidates: workers of the plan's tenant
(tenant isolation is enforced here, once, not by each strategy), not draining, and with room
for the epoch's estimated memory when they report a capacity. A strategy only ranks them.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import AbstractSet

from speedlayer.errors import InvalidRequestError


@dataclass(frozen=True)
class Candidate:
    """A live worker as placement sees it. `memory_bytes` 0: capacity not reported."""

    worker_id: str
    tenant: str
    memory_bytes: int = 0
    assigned_bytes: int = 0
    epoch_count: int = 0
    draining: bool = False

    @property
    def free_bytes(self) -> int:
        return self.memory_bytes - self.assigned_bytes

    def fits(self, size: int) -> bool:
        return self.memory_bytes <= 0 or self.free_bytes >= size


@dataclass(frozen=True)
class PlanSummary:
    """What placement needs of a LoadPlan."""

    tenant: str
    dataset: str
    epoch: str
    estimated_bytes: int = 0

    @property
    def key(self) -> str:
        return f"{self.tenant}/{self.dataset}/{self.epoch}"


def eligible(plan: PlanSummary, candidates: list[Candidate], exclude: AbstractSet[str] = frozenset()) -> list[Candidate]:
    """The candidates any strategy may choose for `plan`: same tenant, not draining, room left."""
    return [c for c in candidates if c.tenant == plan.tenant and not c.draining
            and c.worker_id not in exclude and c.fits(plan.estimated_bytes)]


class AssignmentStrategy(ABC):
    """`select(plan, candidates, replicas)`: up to `replicas` distinct eligible worker ids."""

    name = "abstract"

    def select(self, plan: PlanSummary, candidates: list[Candidate], replicas: int,
               exclude: AbstractSet[str] = frozenset()) -> list[str]:
        pool = eligible(plan, candidates, exclude)
        return [c.worker_id for c in self.rank(plan, pool)[:max(replicas, 0)]]

    @abstractmethod
    def rank(self, plan: PlanSummary, pool: list[Candidate]) -> list[Candidate]:
        """`pool`, best first."""


class RoundRobinStrategy(AssignmentStrategy):
    """Successive epochs start at successive workers (per tenant), in worker id order."""

    name = "round_robin"

    def __init__(self) -> None:
        self._next: dict[str, itertools.count] = {}
        self._lock = threading.Lock()

    def rank(self, plan: PlanSummary, pool: list[Candidate]) -> list[Candidate]:
        if not pool:
            return []
        with self._lock:
            start = next(self._next.setdefault(plan.tenant, itertools.count())) % len(pool)
        ordered = sorted(pool, key=lambda c: c.worker_id)
        return ordered[start:] + ordered[:start]


def _score(epoch_key: str, worker_id: str) -> int:
    digest = hashlib.blake2b(f"{epoch_key}\0{worker_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class RendezvousStrategy(AssignmentStrategy):
    """Highest-random-weight hashing: a worker that joins or leaves moves only the epochs it
    wins or held, about 1/N of them."""

    name = "rendezvous"

    def rank(self, plan: PlanSummary, pool: list[Candidate]) -> list[Candidate]:
        return sorted(pool, key=lambda c: _score(plan.key, c.worker_id), reverse=True)


class CapacityAwareStrategy(AssignmentStrategy):
    """Most free memory first (capacity reported at registration minus what is assigned);
    workers that report no capacity come last, fewest epochs first."""

    name = "capacity"

    def rank(self, plan: PlanSummary, pool: list[Candidate]) -> list[Candidate]:
        return sorted(pool, key=lambda c: (c.memory_bytes <= 0, -c.free_bytes, c.epoch_count, c.worker_id))


def strategy_named(name: str) -> AssignmentStrategy:
    strategies: dict[str, type[RoundRobinStrategy | RendezvousStrategy | CapacityAwareStrategy]] = {
        "round_robin": RoundRobinStrategy, "rendezvous": RendezvousStrategy, "capacity": CapacityAwareStrategy,
    }
    if name not in strategies:
        raise InvalidRequestError(f"strategy {name!r}: expected one of {sorted(strategies)}")
    return strategies[name]()
