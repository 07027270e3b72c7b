"""The tails a worker serves, one per dataset, and the one step that pins an epoch with its tail.

An epoch of a dataset with a tail comes with the offsets its table version holds
(`speedlayer.tail_spec.TailSpec`). The first such epoch a worker publishes starts the dataset's
follower from those offsets; every later one is a **hand-over**: it is published and its
offsets recorded in the same step (`publish_with_tail`, under this registry's lock), and every
answer pins its epoch and takes its tail snapshot in one step too (`pin_with_tail`, under the
same lock; the answer releases the snapshot when it ends, `PinnedTail.release`). So an
answer on epoch E reads exactly the tail rows at or above E's offsets: the
rows E+1 took over are never counted twice, whichever of E and E+1 the gateway routes to, and
none is missing, since the tail keeps the rows of the oldest epoch still served (`trim` follows
`unpublish_with_tail`, when an epoch leaves the worker).

Why the tail sits on the workers serving the epochs rather than in a role of its own: the
answer needs the epoch and the tail rows above it in one DuckDB statement, pinned together; on
the same worker that is a view over an epoch table and the tail's table in one database
(`speedlayer.worker.tail_table`), with no second hop
and no second place that could disagree about the boundary. It also gets the epochs' tenants,
quotas and replication for nothing: each replica of an epoch follows the tail, and a replica
rebuilt elsewhere (a worker killed) starts its follower from the epoch's offsets again.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, TypeVar

from speedlayer.observability.metrics import TAIL_HANDOVERS
from speedlayer.tail_spec import TailSpec
from speedlayer.worker.tail_follower import TailFollower, pipeline_feed
from speedlayer.worker.tail_store import TailSnapshot, TailStore
from speedlayer.worker.tail_table import TailTable

if TYPE_CHECKING:
    import duckdb

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class _DatasetTail:
    spec: TailSpec
    store: TailStore
    follower: TailFollower
    epochs: dict[str, Mapping[str, int]] = field(default_factory=dict)  # epoch -> the offsets it holds


@dataclass(frozen=True)
class PinnedTail:
    """A query's tail: the snapshot (None: the epoch is older than what the tail holds, or the
    dataset has no tail on this worker) and why it is absent, for the answer's metadata."""

    snapshot: TailSnapshot | None
    note: str = ""

    def release(self) -> None:
        """The answer has ended: the rows it read may be deleted (`TailStore`)."""
        if self.snapshot is not None:
            self.snapshot.release()


class WorkerTails:
    """Every dataset tail of one worker. `feed_factory` makes a follower's reader (the pipeline's
    `TailFeed` by default; unit tests pass their own); `cursor` opens a cursor on the database
    the worker's epochs are in (the tails' tables go there, beside them)."""

    def __init__(self, feed_factory: Callable[[TailSpec, str], Any] = pipeline_feed, *,
                 cursor: Callable[[], "duckdb.DuckDBPyConnection"],
                 poll_interval_s: float | None = None) -> None:
        self._feed_factory = feed_factory
        self._cursor = cursor
        self._poll_interval_s = poll_interval_s
        self._lock = threading.Lock()
        self._tails: dict[str, _DatasetTail] = {}

    def publish_with_tail(self, dataset: str, epoch: str, spec: TailSpec, publish: Callable[[], T]) -> T:
        """`publish()` the epoch and record its offsets in one step (the hand-over)."""
        with self._lock:
            published = publish()
            tail = self._tails.get(dataset)
            if tail is not None and tail.spec.follows != spec.follows:
                logger.info("tail of %s: the pipeline or its limits changed; following anew", dataset)
                tail.follower.stop()
                tail.store.close()
                tail = None
            if tail is None:
                tail = self._start(dataset, spec)
            tail.epochs[epoch] = dict(spec.offsets)
            TAIL_HANDOVERS.labels(dataset=dataset).inc()
            return published

    def _start(self, dataset: str, spec: TailSpec) -> _DatasetTail:
        store = TailStore(dict(spec.offsets), TailTable(self._cursor, dataset), spec.limit_rows, spec.limit_bytes)
        kwargs = {} if self._poll_interval_s is None else {"poll_interval_s": self._poll_interval_s}
        follower = TailFollower(dataset, spec, store, self._feed_factory, **kwargs)
        tail = _DatasetTail(spec, store, follower)
        self._tails[dataset] = tail
        follower.start()
        logger.info("tail of %s starts at %s", dataset, dict(spec.offsets))
        return tail

    def unpublish_with_tail(self, dataset: str, epoch: str, retire: Callable[[], T]) -> T:
        """`retire()` the epoch; the tail then keeps only the rows above the epochs left, and stops
        with the last of them."""
        with self._lock:
            retired = retire()
            tail = self._tails.get(dataset)
            if tail is None or tail.epochs.pop(epoch, None) is None:
                return retired
            if not tail.epochs:
                tail.follower.stop()
                tail.store.close()
                del self._tails[dataset]
                logger.info("tail of %s stopped: no epoch of it is served here", dataset)
            else:
                tail.store.trim(oldest(tail.epochs.values()))
            return retired

    def pin_with_tail(self, dataset: str, pin: Callable[[], T],
                      epoch_of: Callable[[T], str]) -> tuple[T, PinnedTail | None]:
        """`pin()` the query's epoch and take the tail rows above it in one step; no tail (None)
        for a dataset that has none on this worker. The caller releases the tail with the epoch."""
        with self._lock:
            pinned = pin()
            tail = self._tails.get(dataset)
            if tail is None:
                return pinned, None
            epoch = epoch_of(pinned)
            offsets = tail.epochs.get(epoch)
            if offsets is None:
                return pinned, PinnedTail(None, f"epoch {epoch} has no tail on this worker")
            snapshot = tail.store.snapshot(offsets)
        if snapshot is None:
            return pinned, PinnedTail(None, f"epoch {epoch} is older than the rows the tail holds: "
                                            "answered from the epoch alone")
        return pinned, PinnedTail(snapshot)

    def stop(self) -> None:
        with self._lock:
            for tail in self._tails.values():
                tail.follower.stop()
                tail.store.close()
            self._tails.clear()

    def datasets(self) -> dict[str, TailStore]:
        """The stores by dataset (metrics and tests)."""
        with self._lock:
            return {dataset: tail.store for dataset, tail in self._tails.items()}


def oldest(epochs: Any) -> dict[str, int]:
    """Per partition, the lowest offset any of the epochs holds up to; a partition one of them
    holds nothing of is left out (nothing of it may be trimmed)."""
    held = list(epochs)
    if not held:
        return {}
    common = set(held[0]).intersection(*held[1:])
    return {topic: min(offsets[topic] for offsets in held) for topic in sorted(common)}
