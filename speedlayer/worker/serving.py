"""Which epoch of each dataset a worker's queries see: publish, retire, resolve, pin.

The loader builds an epoch's DuckDB table out of sight (a staging table renamed when complete);
`ServedDatasets` is the only place that makes it queryable. A query pins exactly one published
epoch for its whole life (`pin`), so it never sees half an epoch, and an epoch swap is atomic
for queries: `publish` of a newer epoch changes what the *next* query resolves to, while
running queries keep the epoch they pinned. `retire` hides an epoch from new queries at once;
its table is released (dropped) only when the last query pinning it has finished.

"Newest" is the highest Delta version published (ties and unknown versions, -1: the later
publish), which is what the gateway routes to as well. Thread-safe; callbacks that drop
tables run outside the lock.
"""

from __future__ import annotations

import itertools
import logging
import threading
from dataclasses import dataclass, field
from typing import Callable

from speedlayer.errors import NotFoundError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedEpoch:
    """One published epoch: the DuckDB relation (table or view in `main`) holding it."""

    dataset: str
    epoch: str
    table: str
    version: int = -1
    sequence: int = 0  # publish order, for ties and unknown versions

    @property
    def rank(self) -> tuple[int, int]:
        return (self.version, self.sequence)


@dataclass
class _Entry:
    served: ServedEpoch
    release: Callable[[], None]
    pins: int = 0
    retired: bool = False


@dataclass
class EpochPin:
    """A query's hold on one epoch; `release()` once the query's last batch is sent (idempotent)."""

    served: ServedEpoch
    _entry: _Entry = field(repr=False)
    _owner: "ServedDatasets" = field(repr=False)
    _released: bool = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._owner._unpin(self._entry)

    def __enter__(self) -> ServedEpoch:
        return self.served

    def __exit__(self, *exc: object) -> None:
        self.release()


class ServedDatasets:
    """The epochs a worker serves, by dataset. `drop_table(name)` releases a retired epoch's
    table unless `publish` was given its own `release` callback."""

    def __init__(self, drop_table: Callable[[str], None]) -> None:
        self._drop_table = drop_table
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._sequence = itertools.count(1)

    def publish(self, dataset: str, epoch: str, table: str, *, version: int = -1,
                release: Callable[[], None] | None = None) -> ServedEpoch:
        """Make a fully loaded epoch queryable as `dataset` (and by its epoch id).

        Publishing an epoch again (a reload) replaces its entry; running queries keep the old
        one (released once they end; not dropped when the table name is unchanged).
        """
        served = ServedEpoch(dataset, epoch, table, version, next(self._sequence))
        entry = _Entry(served, release or (lambda: self._drop_table(table)))
        with self._lock:
            previous = self._entries.get((dataset, epoch))
            self._entries[(dataset, epoch)] = entry
        if previous is not None:
            if previous.served.table == table:  # same table reloaded in place: nothing to drop
                previous.release = lambda: None
            self._retire_entry(previous)
        logger.info("serving %s epoch %s (version %d) from table %s", dataset, epoch, version, table)
        return served

    def retire(self, dataset: str, epoch: str) -> bool:
        """Hide the epoch from new queries; release its table once no query pins it.

        False if the epoch was not published (nothing to do).
        """
        with self._lock:
            entry = self._entries.pop((dataset, epoch), None)
        if entry is None:
            return False
        self._retire_entry(entry)
        return True

    def _retire_entry(self, entry: _Entry) -> None:
        with self._lock:
            entry.retired = True
            release_now = entry.pins == 0
        if release_now:
            self._release(entry)

    def resolve(self, dataset: str, epoch: str | None = None) -> ServedEpoch:
        """The published epoch `epoch` of `dataset`, or its newest; NotFoundError naming both."""
        with self._lock:
            return self._resolve(dataset, epoch).served

    def _resolve(self, dataset: str, epoch: str | None) -> _Entry:
        if epoch:
            entry = self._entries.get((dataset, epoch))
            if entry is None:
                held = sorted(e for d, e in self._entries if d == dataset)
                raise NotFoundError(f"dataset {dataset!r} epoch {epoch!r} is not served by this worker "
                                    f"(it serves {held or 'no epoch of it'})")
            return entry
        candidates = [e for (d, _), e in self._entries.items() if d == dataset]
        if not candidates:
            raise NotFoundError(f"dataset {dataset!r} is not served by this worker")
        return max(candidates, key=lambda e: e.served.rank)

    def pin(self, dataset: str, epoch: str | None = None) -> EpochPin:
        """Resolve and hold the epoch until the returned pin is released."""
        with self._lock:
            entry = self._resolve(dataset, epoch)
            entry.pins += 1
            return EpochPin(entry.served, entry, self)

    def _unpin(self, entry: _Entry) -> None:
        with self._lock:
            entry.pins -= 1
            release_now = entry.retired and entry.pins == 0
        if release_now:
            self._release(entry)

    def _release(self, entry: _Entry) -> None:
        try:
            entry.release()
        except Exception:  # a failed drop leaks memory but must not fail the query that ended
            logger.exception("releasing %s epoch %s (table %s) failed", entry.served.dataset,
                             entry.served.epoch, entry.served.table)

    def served(self) -> list[ServedEpoch]:
        """Every published (not retired) epoch, newest first per dataset."""
        with self._lock:
            return sorted((e.served for e in self._entries.values()), key=lambda s: (s.dataset, s.rank),
                          reverse=True)

    def pins(self, dataset: str, epoch: str) -> int:
        """Queries holding the epoch right now (for tests and metrics)."""
        with self._lock:
            entry = self._entries.get((dataset, epoch))
            return entry.pins if entry else 0
