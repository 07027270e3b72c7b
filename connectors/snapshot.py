"""What the driver knows about one topic at planning time: its objects and its WAL runs.

`connectors.catalog` fills these from etcd, object metadata and WAL directories; the pure
`connectors.planner` turns them into read tasks. They hold no connections, so planning can be
tested with hand-made snapshots. Offsets: descriptor `end_offset` inclusive (as in etcd),
everything else end-exclusive.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence


@dataclass(frozen=True, eq=False)
class StoredObject:
    """One sealed object as planning sees it (built from its descriptor by the catalog).

    `index_offsets`/`index_positions` are the sparse index (§4.5) cleaned up: ascending, the
    first entry is `(start_offset, 0)` and a last sentinel entry is `(end_offset + 1, size)`,
    so every offset of the object lies between two entries. `end_offset` is inclusive.
    """

    object_id: str
    url: str
    start_offset: int
    end_offset: int
    size: int
    created_at: int
    index_offsets: tuple[int, ...]
    index_positions: tuple[int, ...]

    @classmethod
    def build(
        cls, object_id: str, url: str, start_offset: int, end_offset: int, size: int,
        created_at: int, offset_index: Sequence[tuple[int, int]] | None,
    ) -> "StoredObject":
        """Keep only usable index entries (inside the object, strictly increasing)."""
        offsets, positions = [start_offset], [0]
        for offset, pos in offset_index or ():
            if offsets[-1] < offset <= end_offset and positions[-1] < pos < size:
                offsets.append(offset)
                positions.append(pos)
        offsets.append(end_offset + 1)
        positions.append(max(size, positions[-1]))
        return cls(object_id, url, start_offset, end_offset, size, created_at,
                   tuple(offsets), tuple(positions))


@dataclass(frozen=True, eq=False)
class WalRun:
    """Frames of one WAL file with consecutive offsets, located by a header scan.

    `positions[i]` is the header position of the frame with offset `first_offset + i`; the
    last element is the end of the last frame, so `len(positions) - 1` frames are known. A run
    with one position and no frame marks where the frame `first_offset` will be written (the
    WAL head when everything before it was uploaded).

    `restarted_after_upload`: the run began with an offset below the frame before it in its
    file, written after the uploader's checkpointed position (a broker restarted without seal
    appends offsets from 0 again to the old `wal.log`, §6.6, and has not uploaded since), so the
    uploaded objects holding its offsets are an older run's.
    """

    url: str
    first_offset: int
    positions: Sequence[int]
    restarted_after_upload: bool = False

    @property
    def stop_offset(self) -> int:
        """One past the last offset (exclusive)."""
        return self.first_offset + len(self.positions) - 1

    @property
    def identity(self) -> tuple[str, int]:
        """(file, byte position of the first frame): the same run, even sliced from its start.
        Offsets cannot tell two runs apart: a restarted broker writes offset 0 again."""
        return self.url, int(self.positions[0])

    def slice(self, start_offset: int, stop_offset: int) -> "WalRun":
        """The frames `[start_offset, stop_offset)` of this run (clamped to it)."""
        lo = max(start_offset, self.first_offset) - self.first_offset
        hi = min(stop_offset, self.stop_offset) - self.first_offset
        return WalRun(self.url, self.first_offset + lo, self.positions[lo : max(lo, hi) + 1],
                      self.restarted_after_upload and lo == 0)


@dataclass
class TopicSnapshot:
    """What the driver knows about one topic at planning time.

    `objects`: descriptors overlapping the range the snapshot was taken for, by start offset
    (gaps and overlaps left in: the planner reports them). `wal`: a chain of runs with
    consecutive offsets ending at the WAL head (empty when no WAL is reachable or configured).
    `latest_offset`: end-exclusive, the next offset not yet readable. `reused`: offsets the
    current run holds that an older run held too (`connectors.topic_runs.ReusedRange`), which
    the planner reports as data loss wherever a batch reads them. `restarted_at`: the first
    offset of a new run of the topic found by the look this snapshot came from (a stream past
    it never reads the new run below it), else None. `unread_tail`: the tail a WAL the driver
    cannot reach holds (owner, from offset, evidence, reason), else None.
    """

    topic: str
    objects: list[StoredObject]
    wal: list[WalRun]
    latest_offset: int
    object_storage_options: dict = field(default_factory=dict)
    wal_storage_options: dict = field(default_factory=dict)
    sealed_offset: int | None = None
    reused: list = field(default_factory=list)
    restarted_at: int | None = None
    unread_tail: dict | None = None

    @property
    def wal_start(self) -> int | None:
        return self.wal[0].first_offset if self.wal else None


def chain_wal_runs(head: WalRun, candidates: Sequence[WalRun], needed_from: int) -> list[WalRun]:
    """The runs that lead to `head` without a gap, oldest first, reaching back to `needed_from`.

    A predecessor holds the offset just below the chain's first one; candidates are tried from
    the last one backwards, so callers list the preferred (newest) runs last. Stale frames of
    an earlier generation (a real broker appending offsets from 0 again to an old `wal.log`,
    §6.6) are left out because they do not lead to the head.
    """
    chain = [head]
    while chain[0].first_offset > needed_from:
        want = chain[0].first_offset - 1
        prev = next(
            (r for r in reversed(candidates) if r.first_offset <= want < r.stop_offset), None
        )
        if prev is None:
            break
        chain.insert(0, prev.slice(prev.first_offset, want + 1))
    return chain
