"""The gateway's routing table (seed: "Assignment Cache · etcd Watchers · Routing Tables").

Three `LocalCache`s, kept current by etcd watches, hold `/assignments/`, `/workers/` and
`/tenants/` (configs and followed datasets: small); routing reads only them, so the gateway
keeps answering while every master is down (and, with what it last saw, while etcd is
unreachable). A query goes to:

* the epoch it names, or else the newest epoch of the dataset (highest table version, then
  epoch id) that has a READY replica on a live worker. A replica still loading is never
  chosen; a replica that is `leaving` (make-before-break move) still is, until it is dropped;
* its READY replicas, ordered by rendezvous hash of (client id, worker), so a client keeps to
  the same replica (warm caches) and clients spread over the replicas; a replica whose worker
  has no live `/workers` key, or that failed recently, goes last.

A worker's key lives by a lease its master keeps alive; with every master down all those keys
expire although the workers still serve. So the gateway remembers each worker's last
registered address and still routes to replicas of workers it cannot see as live (after the
live ones): a worker that is really gone is then skipped after one refused connection, and
once a master is back it moves the epochs and updates the records.

A dataset the tenant does not have is refused as another tenant's (`TenantIsolationError`)
when some other tenant has it, as not admitted (`NotFoundError`) otherwise; a tenant the speed
layer has nothing of (no assignment, worker or `/tenants/{t}/` key: a typo, most likely) is
refused as unknown (`UnknownTenantError`) first, without naming the tenants there are.

A sharded epoch (`AssignmentRecord.shards`) is chosen like any epoch once every shard has a
servable replica; its route then lists each shard (`ShardRoute`: shard epoch, partition values,
replicas in the client's order), and the gateway asks one replica of each (`scatter`). A shard's
own record is never a route of its own.

Choosing the epoch and ordering replicas are pure functions, tested without etcd.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass

from danube_core.errors import MetadataError
from danube_core.local_cache import LocalCache
from danube_core.metadata import MetadataStore, WatchEvent

from speedlayer.errors import NotFoundError, ReplicaUnavailableError, TenantIsolationError, unknown_tenant
from speedlayer.keys import SpeedLayerKeys
from speedlayer.records import FAILED, R_READY, AssignmentRecord, TenantConfig, WorkerRecord

logger = logging.getLogger(__name__)

SUSPECT_S = 3.0  # a replica that failed is tried last for this long


@dataclass(frozen=True)
class ReplicaEndpoint:
    """Where the gateway sends a query for one READY replica: the worker and its Flight address
    (from `/workers/{tenant}/{worker}`); the replica's state is `records.ReplicaRecord`."""

    worker: str
    address: str


@dataclass(frozen=True)
class ShardRoute:
    """One shard of a sharded epoch: its epoch id on the workers, the partition values its
    files hold (column -> values), its READY replicas in the order to try, and its estimated
    memory (what gathering all of it to the gateway would hold at most)."""

    epoch: str
    values: dict[str, list[str]]
    replicas: tuple[ReplicaEndpoint, ...]
    estimated_bytes: int = 0


@dataclass(frozen=True)
class Route:
    """Where one query goes: an epoch and its reachable READY replicas, in the order to try;
    for a sharded epoch, no replicas of its own but each shard's (`shards`)."""

    tenant: str
    dataset: str
    epoch: str
    version: int
    replicas: tuple[ReplicaEndpoint, ...]
    shards: tuple[ShardRoute, ...] = ()

    def one_shard(self, shard: ShardRoute) -> "Route":
        """The route of one shard, as the gateway forwards (and retries) a query on it."""
        return Route(self.tenant, self.dataset, shard.epoch, self.version, shard.replicas)


def servable(record: AssignmentRecord, addresses: dict[str, str]) -> list[ReplicaEndpoint]:
    """The epoch's READY replicas whose worker's query address is known."""
    if record.status == FAILED:
        return []
    return [ReplicaEndpoint(w, addresses[w]) for w, r in sorted(record.replicas.items())
            if r.state == R_READY and addresses.get(w)]


def shard_replicas(record: AssignmentRecord, records: list[AssignmentRecord],
                   addresses: dict[str, str]) -> list[tuple[AssignmentRecord, list[ReplicaEndpoint]]] | None:
    """A sharded epoch's shards with their servable replicas, in shard order; None unless every
    shard has one (an epoch is served whole or not at all)."""
    by_id = {r.epoch: r for r in records if r.shard_of == record.epoch}
    found = [(by_id[s], servable(by_id[s], addresses)) for s in record.shards if s in by_id]
    if record.status == FAILED or len(found) < len(record.shards) or not all(replicas for _, replicas in found):
        return None
    return found


def choose_epoch(records: list[AssignmentRecord], addresses: dict[str, str],
                 epoch: str | None = None) -> tuple[AssignmentRecord, list[ReplicaEndpoint]] | None:
    """The named epoch, or the newest one with a servable replica (a sharded one: every shard
    with one, and its replicas are its shards', see `shard_replicas`); None if there is none."""
    epochs = [r for r in records if not r.shard_of]
    if epoch:
        for record in epochs:
            if record.epoch == epoch:
                return record, servable(record, addresses)
        return None
    for record in sorted(epochs, key=lambda r: (r.version, r.epoch), reverse=True):
        if record.sharded:
            if shard_replicas(record, records, addresses) is not None:
                return record, []
            continue
        replicas = servable(record, addresses)
        if replicas:
            return record, replicas
    return None


def order_replicas(replicas: list[ReplicaEndpoint], client_id: str, avoid: frozenset[str] = frozenset()) -> list[ReplicaEndpoint]:
    """Rendezvous order for `client_id`: stable per client, spread across clients; `avoid` last."""
    def score(replica: ReplicaEndpoint) -> tuple[bool, bytes]:
        digest = hashlib.blake2b(f"{client_id}\0{replica.worker}".encode(), digest_size=8).digest()
        return (replica.worker in avoid, bytes(255 - b for b in digest))

    return sorted(replicas, key=score)


class RoutingTable:
    """Routes from the gateway's caches of `/assignments/` and `/workers/`."""

    def __init__(self, store: MetadataStore, keys: SpeedLayerKeys) -> None:
        self._keys = keys
        self._assignments = LocalCache(store, [keys.assignments_prefix], name="gateway-assignments")
        self._workers = LocalCache(store, [keys.workers_prefix], name="gateway-workers")
        self._tenants = LocalCache(store, [keys.tenants_prefix], name="gateway-tenants")
        self._parsed: dict[str, tuple[bytes, AssignmentRecord]] = {}
        self._suspects: dict[str, float] = {}
        # {tenant: {worker: last registered address}}: a route reads its own tenant's workers only,
        # so its cost does not grow with the cluster's other tenants.
        self._known: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()

    def start(self) -> "RoutingTable":
        self._assignments.start()
        self._workers.start()
        self._tenants.start()
        self._workers.subscribe(self._keys.workers_prefix, self._worker_event)
        self._assignments.subscribe(self._keys.assignments_prefix, self._assignment_event)
        for key, raw in self._workers.get_prefix(self._keys.workers_prefix):
            self._worker_event(WatchEvent("put", key, raw))
        return self

    def _assignment_event(self, event: WatchEvent) -> None:
        # Evicted epochs' parsed records go with their keys (a new epoch per commit adds up).
        if event.kind == "delete":
            self._parsed.pop(event.key, None)

    def _worker_event(self, event: WatchEvent) -> None:
        if event.kind != "put" or event.value is None:
            return
        try:
            address = WorkerRecord.from_json(event.value, event.key).address
        except MetadataError as exc:
            logger.warning("ignoring %s", exc)
            return
        if address:
            with self._lock:
                tenant, worker = self._keys.parse_worker(event.key)
                self._known.setdefault(tenant, {})[worker] = address

    def close(self) -> None:
        self._assignments.close()
        self._workers.close()
        self._tenants.close()

    @property
    def synced(self) -> bool:
        return self._assignments.synced and self._workers.synced and self._tenants.synced

    def suspect(self, worker: str) -> None:
        """A call to `worker` failed: try its replicas last for a while."""
        with self._lock:
            self._suspects[worker] = time.monotonic() + SUSPECT_S

    def _current_suspects(self) -> frozenset[str]:
        now = time.monotonic()
        with self._lock:
            for worker in [w for w, until in self._suspects.items() if until <= now]:
                del self._suspects[worker]
            return frozenset(self._suspects)

    def live_workers(self, tenant: str) -> set[str]:
        """The tenant's workers whose `/workers` key (lease) is alive."""
        prefix = self._keys.tenant_workers_prefix(tenant)
        return {key[len(prefix):] for key, _ in self._workers.get_prefix(prefix, keys_only=True)}

    def addresses(self, tenant: str) -> dict[str, str]:
        """{worker: last registered query address} of every worker of the tenant ever seen."""
        with self._lock:
            return dict(self._known.get(tenant, {}))

    def records(self, tenant: str, dataset: str) -> list[AssignmentRecord]:
        records = []
        for key, raw in self._assignments.get_prefix(self._keys.dataset_assignments_prefix(tenant, dataset)):
            cached = self._parsed.get(key)
            if cached is None or cached[0] is not raw:
                try:
                    cached = (raw, AssignmentRecord.from_json(raw, key))
                except MetadataError as exc:
                    logger.warning("ignoring %s", exc)
                    continue
                self._parsed[key] = cached
            records.append(cached[1])
        return records

    def datasets(self, tenant: str) -> list[str]:
        """The tenant's datasets that have an epoch (what Flight SQL clients list as tables)."""
        prefix = self._keys.tenant_assignments_prefix(tenant)
        names = {key[len(prefix):].split("/", 1)[0] for key, _ in self._assignments.get_prefix(prefix, keys_only=True)}
        return sorted(names)

    def route(self, tenant: str, dataset: str, client_id: str, epoch: str | None = None) -> Route:
        records = self.records(tenant, dataset)
        if not records:
            self._refuse_missing(tenant, dataset)
        addresses = self.addresses(tenant)
        chosen = choose_epoch(records, addresses, epoch)
        if chosen is None:
            if epoch:
                raise NotFoundError(f"dataset {dataset!r} of tenant {tenant!r} has no epoch {epoch!r}")
            states = {r.epoch: sorted({x.state for x in r.replicas.values()}) for r in records}
            raise ReplicaUnavailableError(f"dataset {dataset!r} of tenant {tenant!r} has no READY replica yet "
                                          f"(epochs: {states})")
        record, replicas = chosen
        live = self.live_workers(tenant)
        suspects = self._current_suspects()

        def ordered(endpoints: list[ReplicaEndpoint]) -> tuple[ReplicaEndpoint, ...]:
            avoid = suspects | frozenset(r.worker for r in endpoints if r.worker not in live)
            return tuple(order_replicas(endpoints, client_id, avoid))

        if record.sharded:
            shards = shard_replicas(record, records, addresses)
            if shards is None:
                raise ReplicaUnavailableError(f"dataset {dataset!r} epoch {record.epoch} is sharded and not every "
                                              f"shard has a READY replica ({record.ready_shards} of "
                                              f"{len(record.shards)} shards READY)")
            return Route(tenant, dataset, record.epoch, record.version, (),
                         tuple(ShardRoute(s.epoch, s.shard_values, ordered(r), s.estimated_memory_bytes)
                               for s, r in shards))
        if not replicas:
            raise ReplicaUnavailableError(f"dataset {dataset!r} epoch {record.epoch} has no READY replica")
        return Route(tenant, dataset, record.epoch, record.version, ordered(replicas))

    def tenant_config(self, tenant: str) -> TenantConfig:
        """`/tenants/{tenant}/config` as last seen (the defaults when there is none, or it is not
        a config: the master refuses such a value too)."""
        raw = self._tenants.get(self._keys.tenant_config(tenant))
        if raw is None:
            return TenantConfig()
        try:
            return TenantConfig.from_json(raw, self._keys.tenant_config(tenant))
        except MetadataError as exc:
            logger.warning("ignoring %s", exc)
            return TenantConfig()

    def known_tenant(self, tenant: str) -> bool:
        """The speed layer has something of `tenant`: an epoch, a worker (live, or seen by this
        gateway), a config or a followed dataset."""
        with self._lock:
            seen = bool(self._known.get(tenant))
        return seen or any(cache.get_prefix(prefix, keys_only=True) for cache, prefix in (
            (self._assignments, self._keys.tenant_assignments_prefix(tenant)),
            (self._workers, self._keys.tenant_workers_prefix(tenant)),
            (self._tenants, self._keys.tenant_prefix(tenant))))

    def _refuse_missing(self, tenant: str, dataset: str) -> None:
        if not self.known_tenant(tenant):
            raise unknown_tenant(tenant, "the tenant's name (--tenant, the x-speedlayer-tenant header)")
        owners = set()
        for key, _ in self._assignments.get_prefix(self._keys.assignments_prefix, keys_only=True):
            parts = key[len(self._keys.assignments_prefix):].split("/")
            if len(parts) == 3 and parts[1] == dataset:
                owners.add(parts[0])
        owners.discard(tenant)
        if owners:
            raise TenantIsolationError(f"tenant {tenant!r} may not query dataset {dataset!r}: it is not one of "
                                       f"the tenant's datasets")
        raise NotFoundError(f"dataset {dataset!r} of tenant {tenant!r} is not admitted to the speed layer")
