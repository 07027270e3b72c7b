"""Which epoch queries of each dataset see on this worker: one pointer per dataset, swapped whole.

The agent publishes an epoch only once its relation holds the whole epoch (a full load renamed
into place, or an increment's view created over complete tables), and the swap is a single
assignment under a lock: a query resolves the dataset to one (epoch, relation) pair and reads
that relation, so it sees either the old epoch or the new one, never a mix. The relation of an
epoch that is no longer served stays until the master evicts it, so a query that resolved it
just before a swap still finds it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class ServedEpoch:
    dataset: str
    epoch: str
    relation: str
    version: int


class ServedEpochs:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._served: dict[str, ServedEpoch] = {}

    def publish(self, dataset: str, epoch: str, relation: str, version: int) -> None:
        with self._lock:
            self._served[dataset] = ServedEpoch(dataset, epoch, relation, version)

    def retire(self, dataset: str, epoch: str) -> None:
        """Stop serving `dataset` if `epoch` is what it serves (its last epoch was dropped)."""
        with self._lock:
            current = self._served.get(dataset)
            if current is not None and current.epoch == epoch:
                del self._served[dataset]

    def get(self, dataset: str) -> ServedEpoch | None:
        with self._lock:
            return self._served.get(dataset)

    def all(self) -> dict[str, ServedEpoch]:
        with self._lock:
            return dict(self._served)
