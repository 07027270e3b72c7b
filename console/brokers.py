"""What the brokers page shows, from the console's etcd cache: each registered broker (or one
that still owns topics), whether it leads, its mode, its last load report (CPU and memory as
percentages, disk and network I/O in bytes per second, as `broker.resource_usage` measures them)
and the topics assigned to it; its Prometheus endpoint is the registration's
`prom_exporter`, scraped by the page when present.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from danube_core import keys
from danube_core.errors import DanubeError
from danube_core.records import BrokerRegistration, BrokerState, LoadReport, parse_u64

from console.topics import KeyReader, ParsedValues


@dataclass(frozen=True)
class BrokerRow:
    broker_id: int
    registration: BrokerRegistration | None  # None: not registered (its lease expired) but still owning topics
    mode: str
    leader: bool
    load: LoadReport | None
    topics: list[str] = field(default_factory=list)

    @property
    def usage(self) -> dict[str, float]:
        """Resource -> usage (CPU, Memory, DiskIO, NetworkIO) of the last load report."""
        return {u.resource: u.usage for u in self.load.resources_usage} if self.load is not None else {}


class BrokersReader:
    def __init__(self) -> None:
        self._parsed = ParsedValues()

    def leader(self, cache: KeyReader) -> int | None:
        raw = cache.get(keys.LEADER_KEY)
        try:
            return self._parsed.get(keys.LEADER_KEY, raw, parse_u64) if raw is not None else None
        except DanubeError:
            return None

    def brokers(self, cache: KeyReader) -> list[BrokerRow]:
        registrations: dict[int, BrokerRegistration] = {}
        for key, raw in cache.get_prefix(keys.REGISTER_PREFIX):
            broker = key[len(keys.REGISTER_PREFIX):]
            if broker.isdigit():
                registrations[int(broker)] = self._parsed.get(key, raw, BrokerRegistration.from_json)
        owned: dict[int, list[str]] = {}
        for key, _ in cache.get_prefix(keys.BROKERS_PREFIX, keys_only=True):
            parsed = keys.parse_assignment_key(key)
            if parsed is not None:
                owned.setdefault(parsed[0], []).append(str(parsed[1]))
        leader = self.leader(cache)
        return [BrokerRow(b, registrations.get(b), self._mode(cache, b), b == leader, self._load(cache, b),
                          sorted(owned.get(b, ()))) for b in sorted(set(registrations) | set(owned))]

    def wal_url(self, cache: KeyReader, broker: int | None) -> str | None:
        """Where `broker` serves its WAL: its registration's `wal_url`, else its state key's
        (an owner that died leaves its WAL readable there until its topics move)."""
        if broker is None:
            return None
        try:
            key = keys.register_key(broker)
            raw = cache.get(key)
            registration = self._parsed.get(key, raw, BrokerRegistration.from_json) if raw is not None else None
            if registration is not None and registration.wal_url:
                return registration.wal_url
            key = keys.broker_state_key(broker)
            raw = cache.get(key)
            return self._parsed.get(key, raw, BrokerState.from_json).wal_url if raw is not None else None
        except DanubeError:
            return None

    def _mode(self, cache: KeyReader, broker: int) -> str:
        key = keys.broker_state_key(broker)
        raw = cache.get(key)
        return self._parsed.get(key, raw, BrokerState.from_json).mode if raw is not None else "active"

    def _load(self, cache: KeyReader, broker: int) -> LoadReport | None:
        key = keys.load_key(broker)
        raw = cache.get(key)
        return self._parsed.get(key, raw, LoadReport.from_json) if raw is not None else None
