"""The decoded rows of a dataset's tail held in memory, and the part of them one answer reads.

The store holds, per topic partition, a contiguous run of offsets `[start[p], end[p])`: the rows
in a DuckDB table beside the epochs (`TailTable`, what answers scan), their keys (`_topic`,
`_offset`) as immutable Arrow chunks in offset order (what the store counts and cuts by;
quarantined offsets are absent, as they are from the pipeline's Delta table). An answer on epoch E, which holds everything below `offsets[p]`, reads
exactly the rows with `offsets[p] <= _offset`: no offset E holds is counted twice, and since the
run reaches back to at least `offsets[p]`, none is missing. If it does not reach back that far
(the epoch is older than what the store kept), `snapshot` says so rather than answer with a gap.

A snapshot is a list of the chunks at one moment and the offset ranges per partition its answer
reads from the table, so rows appended after it are never read. Rows are deleted from the table
(a trim, the table dropped when the tail stops) only once every snapshot taken before that trim
is released (`TailSnapshot.release`, when its answer ends), so an answer always finds the rows
its snapshot counted; chunks are never changed in place.
The store is bounded by `limit_rows` / `limit_bytes`: `room()` tells the follower how many rows
it may still add; past it the tail stops advancing and says how far behind it is, never drops.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from speedlayer.worker.tail_table import OFFSET, TOPIC, TailTable

COMPACT_ROWS = 64 * 1024  # appends are merged into the last chunk up to this many rows


@dataclass(frozen=True)
class _Chunk:
    rows: pa.Table            # the keys (`_topic`, `_offset`) of the rows this chunk holds
    first: Mapping[str, int]  # per partition, the first offset this chunk read (its rows may start later)
    ends: Mapping[str, int]   # per partition, the end-exclusive offset read up to with this chunk
    ascending: bool = False   # one partition's rows in offset order: an answer slices, not filters
    nbytes: int = 0           # the Arrow size of the whole rows (what limit_bytes counts)


def _chunk(keys: pa.Table, first: Mapping[str, int], ends: Mapping[str, int], nbytes: int = 0) -> _Chunk:
    """A chunk, noting whether it is one partition's rows in ascending offset order (a read of one
    partition is; answers then cut it at their epoch's offset with a binary search)."""
    ascending = False
    if len(ends) == 1 and keys.num_rows:
        offsets = keys[OFFSET]
        ascending = keys.num_rows == 1 or bool(pc.all(pc.greater(offsets.slice(1), offsets.slice(0, keys.num_rows - 1))).as_py())
    return _Chunk(keys, dict(first), dict(ends), ascending, nbytes)



@dataclass(frozen=True)
class TailSnapshot:
    """What one answer reads of the tail: `relation` (a SELECT of the rows at or above the epoch's
    offsets in the tail's table; None when there are none), their keys (`keys`), and what the
    answer's metadata says: the last offset per partition the tail has read (end - 1), how old
    that is, its state and the rows the store holds in all. `release()` once the answer has read
    it (the rows may be deleted from then on)."""

    keys: pa.Table | None
    relation: str | None
    last_offsets: Mapping[str, int]
    age_ms: int
    state: str
    held_rows: int
    release: Callable[[], None] = field(default=lambda: None, repr=False, compare=False)

    def metadata(self) -> dict:
        return {"state": self.state, "last_offsets": dict(sorted(self.last_offsets.items())),
                "age_ms": self.age_ms, "rows": 0 if self.keys is None else self.keys.num_rows,
                "held_rows": self.held_rows}


@dataclass
class TailStore:
    """`start`: the offsets the tail begins at (end-exclusive offsets of the epoch it started from);
    `table`: where its rows are kept for answers."""

    start: dict[str, int]
    table: TailTable
    limit_rows: int
    limit_bytes: int = 0
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    _chunks: list[_Chunk] = field(default_factory=list, repr=False)
    _ends: dict[str, int] = field(default_factory=dict, repr=False)
    _rows: int = 0
    _bytes: int = 0
    _read_at: float | None = None  # when the follower last found the topic read up to its head
    _state: str = "starting"
    _closed: bool = False
    _dropped: bool = False
    _generation: int = 0  # trims so far: a snapshot is of the generation it was taken in
    _readers: Counter = field(default_factory=Counter, repr=False)  # generation -> snapshots not released
    _deletes: list[tuple[int, dict[str, int]]] = field(default_factory=list, repr=False)  # (generation, below)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.limit_rows <= 0:
            raise ValueError(f"limit_rows={self.limit_rows}: a tail must be allowed at least one row")
        self._ends = dict(self.start)

    @property
    def ends(self) -> dict[str, int]:
        with self._lock:
            return dict(self._ends)

    def room(self) -> int:
        """Rows the store may still take (0: full, the follower waits for a trim)."""
        with self._lock:
            rows = self.limit_rows - self._rows
            if self.limit_bytes and self._bytes >= self.limit_bytes:
                return 0
            return max(rows, 0)

    def append(self, rows: pa.Table, first: Mapping[str, int], ends: Mapping[str, int], *,
               state: str | None = None, caught_up: bool = False) -> None:
        """Add what was read of `[first[p], ends[p])`; `first` must continue where the store ends,
        or start below it when a trim moved the store past offsets every epoch holds meanwhile
        (those rows are dropped). `state` and `caught_up`: as `mark`, in the same step, so no
        answer shows the new rows with the state from before the read."""
        with self._lock:
            if self._closed:
                return  # the tail stopped while this read was on its way
            if state is not None:
                self._mark_locked(state, caught_up)
            skip: dict[str, int] = {}
            for topic, begin in first.items():
                held = self._ends.get(topic)
                if held is not None and begin > held:
                    raise ValueError(f"tail of {topic}: read from {begin}, the store ends at {held} "
                                     "(the follower must continue where it stopped)")
                if held is not None and begin < held:
                    skip[topic] = held
            if skip:
                rows = _rows_above(rows, skip) if rows.num_rows else rows
                first = {t: max(b, skip.get(t, b)) for t, b in first.items()}
                ends = {t: max(e, skip.get(t, e)) for t, e in ends.items()}
            if rows.num_rows:
                self.table.append(rows)
                chunk = _chunk(rows.select([TOPIC, OFFSET]), first, ends, rows.nbytes)
                last = self._chunks[-1] if self._chunks else None
                if last is not None and last.rows.num_rows + rows.num_rows <= COMPACT_ROWS:
                    # A read every few milliseconds adds a few rows: merged into the last chunk
                    # (a new one: snapshots keep the old), answers cut a few chunks, not thousands.
                    chunk = _chunk(pa.concat_tables([last.rows, chunk.rows]).combine_chunks(),
                                   {**dict(first), **dict(last.first)}, {**dict(last.ends), **dict(ends)},
                                   last.nbytes + rows.nbytes)
                    self._chunks = [*self._chunks[:-1], chunk]
                else:
                    self._chunks = [*self._chunks, chunk]
                self._rows += rows.num_rows
                self._bytes += rows.nbytes
            for topic, begin in first.items():
                self.start.setdefault(topic, begin)
            self._ends.update(ends)

    def mark(self, state: str, *, caught_up: bool = False) -> None:
        """The follower's state (`following`, `behind: ...`, an error); `caught_up`: it has just read
        the topic up to its head, which is what the answer's age counts from."""
        with self._lock:
            self._mark_locked(state, caught_up)

    def _mark_locked(self, state: str, caught_up: bool) -> None:
        self._state = state
        if caught_up:
            self._read_at = self.clock()

    def age_ms(self) -> int:
        """Milliseconds since the tail last read its topic up to the head (-1: not yet)."""
        with self._lock:
            return -1 if self._read_at is None else int((self.clock() - self._read_at) * 1000)

    def covers(self, offsets: Mapping[str, int]) -> bool:
        """True when the store reaches back to `offsets` in every partition it holds (no gap)."""
        with self._lock:
            return self._covers(offsets)

    def _covers(self, offsets: Mapping[str, int]) -> bool:
        return all(offsets.get(topic, begin) >= begin for topic, begin in self.start.items())

    def snapshot(self, offsets: Mapping[str, int]) -> TailSnapshot | None:
        """The rows at or above `offsets` (an epoch's), or None when the store does not reach back
        to them (answering would leave a gap). The caller releases it when its answer ends."""
        with self._lock:
            if not self._covers(offsets):
                return None
            chunks, ends, state, held = self._chunks, dict(self._ends), self._state, self._rows
            age = -1 if self._read_at is None else int((self.clock() - self._read_at) * 1000)
            generation = self._generation
            self._readers[generation] += 1
        released = threading.Event()

        def release() -> None:
            if not released.is_set():
                released.set()
                self._release(generation)
        parts = [part for part in (_above(chunk, offsets) for chunk in chunks) if part is not None]
        keys = pa.concat_tables(parts) if parts else None
        ranges = {topic: (offsets.get(topic, 0), end) for topic, end in ends.items() if end > offsets.get(topic, 0)}
        relation = self.table.relation(ranges) if keys is not None else None
        last = {topic: end - 1 for topic, (_, end) in ranges.items()}
        return TailSnapshot(keys, relation, last, age, state, held, release)

    def _release(self, generation: int) -> None:
        with self._lock:
            self._readers[generation] -= 1
            if self._readers[generation] <= 0:
                del self._readers[generation]
            self._apply_deletes()

    def _apply_deletes(self) -> None:
        """Delete what the trims took once no snapshot of their generation or before is read."""
        oldest = min(self._readers, default=None)
        while self._deletes and (oldest is None or self._deletes[0][0] < oldest):
            _, below = self._deletes.pop(0)
            if not self._closed:
                self.table.delete_below(below)
        if self._closed and oldest is None and not self._dropped:
            self._dropped = True
            self.table.drop()

    def trim(self, offsets: Mapping[str, int]) -> None:
        """Drop the rows below `offsets` (the oldest epoch still served holds them); the store
        then starts there."""
        with self._lock:
            kept: list[_Chunk] = []
            for chunk in self._chunks:
                part = _above(chunk, offsets)
                if part is None:
                    continue
                kept.append(chunk if part is chunk.rows else
                            _Chunk(part, chunk.first, chunk.ends, chunk.ascending,
                                   chunk.nbytes * part.num_rows // max(chunk.rows.num_rows, 1)))
            self._chunks = kept
            self._rows = sum(c.rows.num_rows for c in kept)
            self._bytes = sum(c.nbytes for c in kept)
            self._deletes.append((self._generation, dict(offsets)))
            self._generation += 1
            self._apply_deletes()
            for topic, begin in list(self.start.items()):
                if topic in offsets and offsets[topic] > begin:
                    self.start[topic] = offsets[topic]
                    # every epoch still served holds what lies below: the tail need not read it
                    self._ends[topic] = max(self._ends.get(topic, begin), offsets[topic])

    @property
    def held(self) -> tuple[int, int]:
        """(rows, bytes) held."""
        with self._lock:
            return self._rows, self._bytes

    def close(self) -> None:
        """Drop the rows (the tail has stopped), once the snapshots being read are released."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._apply_deletes()


def _rows_above(rows: pa.Table, offsets: Mapping[str, int]) -> pa.Table:
    """The rows of partitions in `offsets` at or above them, and every row of the others."""
    keep = None
    for topic, offset in offsets.items():
        below = pc.and_(pc.equal(rows[TOPIC], topic), pc.less(rows[OFFSET], offset))
        keep = below if keep is None else pc.or_(keep, below)
    return rows if keep is None else rows.filter(pc.invert(keep))


def _above(chunk: _Chunk, offsets: Mapping[str, int]) -> pa.Table | None:
    """The chunk's rows at or above `offsets` (the chunk itself when all are), None when none are."""
    if all(chunk.first.get(t, 0) >= offsets.get(t, 0) for t in chunk.ends):
        return chunk.rows
    if all(end <= offsets.get(t, 0) for t, end in chunk.ends.items()):
        return None
    if chunk.ascending:
        (topic,) = chunk.ends
        held = chunk.rows[OFFSET].combine_chunks().to_numpy(zero_copy_only=False)
        part = chunk.rows.slice(int(np.searchsorted(held, offsets.get(topic, 0), side="left")))
        return part if part.num_rows else None
    keep = None
    for topic in chunk.ends:
        mine = pc.and_(pc.equal(chunk.rows[TOPIC], topic), pc.greater_equal(chunk.rows[OFFSET], offsets.get(topic, 0)))
        keep = mine if keep is None else pc.or_(keep, mine)
    part = chunk.rows.filter(keep)
    return part if part.num_rows else None
