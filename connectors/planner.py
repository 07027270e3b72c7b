"""Pure planning: topic snapshots + offset ranges + limits in, read tasks out. No I/O here.

As Spark's `KafkaOffsetRangeCalculator`, this is arithmetic over what the driver already
looked up (`connectors.catalog` builds the `TopicSnapshot`s), so it is tested table by table
without Spark or servers. Offsets in the dicts are end-exclusive (Spark's convention);
descriptor `end_offset`s stay inclusive as in etcd (spec §6.4).

A topic's offsets `[start, end)` are served by its sealed objects first, then by the WAL chain
for what lies beyond the last object (spec §6.5: objects, then the WAL). Each object is read
in byte ranges cut at its sparse offset-index entries (§4.5), so one task never exceeds
`max_partition_bytes` unless a single index block does; WAL runs can be cut at any frame
because the catalog scanned their headers. Every hole is reported through
`connectors.data_loss.report`: a gap in the descriptor chain, a descriptor that starts at or
below the previous one's end (a real broker restarted a crashed topic at 0 and overwrote
descriptor 0, §6.6), a WAL that does not reach back to the last object (pruned before upload,
or a previous owner's WAL that cannot be reached), and an end below the start.
"""

from __future__ import annotations

import logging
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Callable, Sequence

from connectors.data_loss import LostRange, report, total_lost
from connectors.read_task import WAL_SOURCE, ReadTask
from connectors.snapshot import StoredObject, TopicSnapshot, WalRun

logger = logging.getLogger(__name__)


@dataclass
class PlanResult:
    """The tasks of one batch and the offsets it had to skip (only with failOnDataLoss=false)."""

    tasks: list[ReadTask]
    lost: list[LostRange]

    @property
    def lost_offsets(self) -> dict[str, int]:
        """Lost offsets per topic, for progress metrics."""
        return total_lost(self.lost)


Segment = StoredObject | WalRun
# (object, byte_start, byte_end) -> (offset, header position) of every frame in that range.
FrameIndexReader = Callable[[StoredObject, int, int], Sequence[tuple[int, int]]]


@dataclass(frozen=True)
class _Piece:
    segment: Segment
    start: int  # inclusive
    stop: int  # exclusive


@dataclass(frozen=True)
class _Gap:
    start: int
    stop: int
    reason: str
    source: str | None


def plan_tasks(
    snapshots: dict[str, TopicSnapshot],
    start: dict[str, int],
    end: dict[str, int],
    *,
    max_partition_bytes: int,
    fail_on_data_loss: bool,
) -> PlanResult:
    """Read tasks covering `[start[t], end[t])` for every topic `t` of `end`.

    Raises DataLossError on the first hole when `fail_on_data_loss`; otherwise the holes are
    logged and returned in `PlanResult.lost`, and the tasks skip them.
    """
    if max_partition_bytes < 1:
        raise ValueError(f"max_partition_bytes={max_partition_bytes}: expected an integer >= 1")
    tasks: list[ReadTask] = []
    lost: list[LostRange] = []
    for topic in sorted(end):
        s, e = _start_of(start, topic), end[topic]
        if e < s:
            lost.append(report(
                topic, e, s,
                f"offsets went backwards: the batch starts at {s} but the topic now ends at {e} "
                "(a broker restarted the topic at offset 0, or it was deleted and recreated)",
                fail_on_data_loss=fail_on_data_loss,
            ))
            continue
        if e == s:
            continue
        snap = _snapshot_of(snapshots, topic)
        lost.extend(_report_reuse(snap, s, e, fail_on_data_loss))
        pieces, gaps = _cover(snap, s, e)
        for gap in gaps:
            lost.append(report(topic, gap.start, gap.stop, gap.reason,
                               fail_on_data_loss=fail_on_data_loss, source=gap.source))
        for piece in pieces:
            tasks.extend(_tasks_for(snap, piece, max_partition_bytes, fail_on_data_loss))
    return PlanResult(tasks, lost)


def _report_reuse(snap: TopicSnapshot, s: int, e: int, fail_on_data_loss: bool) -> list[LostRange]:
    """Offsets in `[s, e)` an older run held too: its messages there are lost to this read.

    The current run's messages at those offsets are still read (never a mix of two runs at
    one offset); the older run's stay in storage for a salvage read.
    """
    lost = []
    for reused in snap.reused:
        lo, hi = max(reused.start, s), min(reused.stop, e)
        if lo < hi:
            names = ", ".join(src.name for src in reused.sources if src.url) or None
            lost.append(report(snap.topic, lo, hi, reused.describe(),
                               fail_on_data_loss=fail_on_data_loss, source=names))
    return lost


def _start_of(start: dict[str, int], topic: str) -> int:
    if topic not in start:
        raise ValueError(f"no start offset for topic {topic}: every topic of the end offsets needs one")
    return start[topic]


def _snapshot_of(snapshots: dict[str, TopicSnapshot], topic: str) -> TopicSnapshot:
    if topic not in snapshots:
        raise ValueError(f"no snapshot for topic {topic}, which has offsets to read")
    return snapshots[topic]


def _cover(snap: TopicSnapshot, s: int, e: int) -> tuple[list[_Piece], list[_Gap]]:
    """Split `[s, e)` into pieces served by objects, then by the WAL, plus the holes."""
    pieces: list[_Piece] = []
    gaps: list[_Gap] = []
    pos, prev = s, None
    for obj in snap.objects:
        if pos >= e or obj.start_offset >= e:
            break
        if prev is not None and obj.start_offset <= prev.end_offset:
            gap = _backwards_gap(obj, prev, s, e)
            if gap is not None:
                gaps.append(gap)
        prev = obj if prev is None or obj.end_offset > prev.end_offset else prev
        if obj.end_offset < pos:
            continue
        if obj.start_offset > pos:
            _cover_from_wal(snap, pos, obj.start_offset, pieces, gaps,
                            f"gap in the descriptor chain before object {obj.object_id}")
            pos = obj.start_offset
        stop = min(obj.end_offset + 1, e)
        pieces.append(_Piece(obj, pos, stop))
        pos = stop
    if pos < e:
        _cover_from_wal(snap, pos, e, pieces, gaps, _wal_gap_reason(snap, pos))
    return pieces, gaps


def _backwards_gap(obj: StoredObject, prev: StoredObject, s: int, e: int) -> _Gap | None:
    """The offsets two objects both claim, clipped to the batch `[s, e)`; None if outside it."""
    lo, hi = max(obj.start_offset, s), min(obj.end_offset, prev.end_offset, e - 1) + 1
    if lo >= hi:
        return None
    return _Gap(
        lo, hi,
        f"offsets went backwards: object {obj.object_id} starts at {obj.start_offset}, at or "
        f"below the end {prev.end_offset} of object {prev.object_id} (a broker restarted the "
        "topic at offset 0 and overwrote older descriptors)",
        obj.object_id,
    )


def _wal_gap_reason(snap: TopicSnapshot, pos: int) -> str:
    if not snap.wal:
        return (f"offset {pos} is in no object and no WAL holding it can be read (sealed but never "
                "uploaded, pruned before upload, or walRoot=none)")
    return (f"offset {pos} is in no object and the WAL starts only at {snap.wal_start} (pruned "
            "before upload, or a previous owner's WAL that cannot be reached)")


def _cover_from_wal(
    snap: TopicSnapshot, lo: int, hi: int, pieces: list[_Piece], gaps: list[_Gap], reason: str
) -> None:
    """Pieces for `[lo, hi)` from the WAL chain; whatever it does not hold is a gap."""
    pos = lo
    for run in snap.wal:
        if run.stop_offset <= pos or run.first_offset >= hi:
            continue
        if run.first_offset > pos:
            gaps.append(_Gap(pos, run.first_offset, reason, WAL_SOURCE))
            pos = run.first_offset
        stop = min(run.stop_offset, hi)
        pieces.append(_Piece(run, pos, stop))
        pos = stop
    if pos < hi:
        if snap.wal and pos >= snap.wal[-1].stop_offset:
            reason = (f"offsets from {pos} are beyond the newest readable offset "
                      f"{snap.wal[-1].stop_offset - 1} of the WAL")
        gaps.append(_Gap(pos, hi, reason, WAL_SOURCE if snap.wal else None))


def _anchors(segment: Segment) -> tuple[Sequence[int], Sequence[int]]:
    """(offsets, byte positions) whose byte distances are known exactly."""
    if isinstance(segment, WalRun):
        return range(segment.first_offset, segment.stop_offset + 1), segment.positions
    return segment.index_offsets, segment.index_positions


def _tasks_for(
    snap: TopicSnapshot, piece: _Piece, max_bytes: int, fail_on_data_loss: bool
) -> list[ReadTask]:
    """Cut one piece at anchors into tasks of at most `max_bytes` (one block at least)."""
    seg = piece.segment
    offsets, positions = _anchors(seg)
    i = bisect_right(offsets, piece.start) - 1
    j = bisect_left(offsets, piece.stop)
    is_wal = isinstance(seg, WalRun)
    tasks = []
    while i < j:
        k = bisect_right(positions, positions[i] + max_bytes, i + 1, j + 1) - 1
        k = max(k, i + 1)
        to_end = not is_wal and k == len(offsets) - 1  # read to the object's real end
        tasks.append(ReadTask(
            topic=snap.topic,
            source=WAL_SOURCE if is_wal else seg.object_id,  # type: ignore[union-attr]  # not a WalRun
            url=seg.url,
            storage_options=snap.wal_storage_options if is_wal else snap.object_storage_options,
            byte_start=int(positions[i]),
            byte_end=None if to_end else int(positions[k]),
            start_offset=max(piece.start, offsets[i]),
            end_offset=min(piece.stop, offsets[k]),
            strict=not is_wal,
            fail_on_data_loss=fail_on_data_loss,
            size_hint=int(positions[k]) - int(positions[i]),
        ))
        i = k
    return tasks


# ---- packing tasks into Spark partitions ----------------------------------------------------

# What opening one more file costs, in bytes read (one ranged request's latency at object-store
# throughput). Spark's file sources charge `spark.sql.files.openCostInBytes` (4 MiB) for the
# same reason; Danube objects are small and many, so the charge is smaller here: a backfill of
# a long history runs about `total bytes / maxPartitionBytes` tasks, not one per object.
OPEN_COST_BYTES = 128 * 1024


def pack_tasks(tasks: Sequence[ReadTask], max_partition_bytes: int,
               open_cost: int = OPEN_COST_BYTES) -> list[list[ReadTask]]:
    """Consecutive tasks grouped into partitions of at most `max_partition_bytes` (counting
    `open_cost` per task), in planning order, so each partition reads its ranges in offset
    order; a task larger than the limit is a partition of its own (as Spark packs files)."""
    groups: list[list[ReadTask]] = []
    current: list[ReadTask] = []
    used = 0
    for task in tasks:
        cost = task.size_hint + open_cost
        if current and used + cost > max_partition_bytes:
            groups.append(current)
            current, used = [], 0
        current.append(task)
        used += cost
    if current:
        groups.append(current)
    return groups


# ---- admission control --------------------------------------------------------------------


def cap_end_offsets(
    start: dict[str, int],
    latest: dict[str, int],
    snapshots: dict[str, TopicSnapshot],
    *,
    max_messages: int | None,
    max_bytes: int | None,
    frame_index: FrameIndexReader | None = None,
) -> dict[str, int]:
    """End offsets for one batch: `latest`, bounded by messages and bytes.

    Both budgets are shared among topics in proportion to their backlog (like Kafka's
    `rateLimit`) and are never exceeded, with one exception that keeps a stream moving: when
    no topic would advance, the largest backlog gets the whole budget, and a single message
    larger than `max_bytes` is admitted alone. Byte counts are frame bytes (header +
    payload), exact at index entries and WAL frames; a cut inside an object's index block
    needs its frame headers, which `frame_index` reads when given (without it, cuts round
    down to index entries). Topics whose latest offset is below their start are returned
    unchanged, for `plan_tasks` to report.
    """
    for name, limit in (("max_messages", max_messages), ("max_bytes", max_bytes)):
        if limit is not None and limit < 1:
            raise ValueError(f"{name}={limit}: expected None or an integer >= 1")
    end = dict(latest)
    backlog = {t: end[t] - _start_of(start, t) for t in end if end[t] > _start_of(start, t)}
    if max_messages is not None:
        for topic, n in _share(max_messages, backlog).items():
            end[topic] = start[topic] + n
    if max_bytes is not None:
        end = _cap_bytes(start, end, snapshots, max_bytes, frame_index)
    return end


def _share(limit: int, weights: dict[str, int]) -> dict[str, int]:
    """Split `limit` units over topics in proportion to their weights (largest remainders get
    the leftover units), each at most its weight and all together at most `limit`. A topic
    left with nothing gets one unit from the largest share, so small topics are not starved.
    """
    total = sum(weights.values())
    if total <= limit:
        return dict(weights)
    given = {t: limit * w // total for t, w in weights.items()}
    leftover = limit - sum(given.values())
    for topic in sorted(weights, key=lambda t: (-(limit * weights[t] % total), t))[:leftover]:
        given[topic] += 1
    for topic in sorted(weights, key=lambda t: (-weights[t], t)):
        donor = max(given, key=lambda t: (given[t], t))
        if given[topic] > 0:
            continue
        if given[donor] <= 1:
            break
        given[donor] -= 1
        given[topic] += 1
    return given


def _cap_bytes(
    start: dict[str, int], end: dict[str, int], snapshots: dict[str, TopicSnapshot],
    max_bytes: int, frame_index: FrameIndexReader | None,
) -> dict[str, int]:
    pieces = {
        t: _cover(_snapshot_of(snapshots, t), start[t], end[t])[0]
        for t in end if end[t] > start[t]
    }
    need = {t: _bytes_upper_bound(p) for t, p in pieces.items()}
    need = {t: n for t, n in need.items() if n > 0}
    if sum(need.values()) <= max_bytes:
        return dict(end)
    capped = dict(end)
    for topic, budget in _share(max_bytes, need).items():
        capped[topic] = _byte_cut(pieces[topic], start[topic], end[topic], budget, frame_index)
    if all(capped[t] == start[t] for t in need):
        topic = min(need, key=lambda t: (-need[t], t))
        cut = _byte_cut(pieces[topic], start[topic], end[topic], max_bytes, frame_index)
        capped[topic] = cut if cut > start[topic] else start[topic] + 1
        logger.info("maxBytesPerTrigger=%d admits no whole message; admitting offsets [%d, %d) of %s",
                    max_bytes, start[topic], capped[topic], topic)
    return capped


def _piece_bounds(offsets: Sequence[int], positions: Sequence[int], piece: _Piece) -> tuple[int, int]:
    """Byte positions enclosing the piece: exact at anchors, else the enclosing anchors."""
    return (int(positions[bisect_right(offsets, piece.start) - 1]),
            int(positions[bisect_left(offsets, piece.stop)]))


def _bytes_upper_bound(pieces: list[_Piece]) -> int:
    total = 0
    for piece in pieces:
        lo, hi = _piece_bounds(*_anchors(piece.segment), piece)
        total += hi - lo
    return total


def _byte_cut(
    pieces: list[_Piece], start: int, end: int, budget: int, frame_index: FrameIndexReader | None
) -> int:
    """Largest end offset whose bytes from `start` are known to fit in `budget`.

    Holes between pieces cost nothing and are included, so `plan_tasks` reports them instead
    of a stream stopping in front of them forever.
    """
    used = 0
    for piece in pieces:
        offsets, positions = _anchors(piece.segment)
        lo, hi = _piece_bounds(offsets, positions, piece)
        if used + hi - lo <= budget:
            used += hi - lo
            continue
        if frame_index is not None and isinstance(piece.segment, StoredObject):
            offsets, positions = _refined(piece, budget - used, frame_index)
            lo = _piece_bounds(offsets, positions, piece)[0]
        m = bisect_right(positions, lo + budget - used) - 1
        m = min(m, bisect_right(offsets, piece.stop) - 1)
        return max(piece.start, offsets[m])
    return end


def _refined(
    piece: _Piece, remaining: int, frame_index: FrameIndexReader
) -> tuple[list[int], list[int]]:
    """Object anchors plus every frame of the blocks holding the piece start and the cut."""
    obj = piece.segment
    assert isinstance(obj, StoredObject)
    offsets, positions = list(obj.index_offsets), list(obj.index_positions)
    first = bisect_right(offsets, piece.start) - 1
    offsets, positions = _refine_block(obj, offsets, positions, first, frame_index)
    lo = int(positions[bisect_right(offsets, piece.start) - 1])
    cut_block = bisect_right(positions, lo + remaining) - 1
    if cut_block < len(offsets) - 1:
        offsets, positions = _refine_block(obj, offsets, positions, cut_block, frame_index)
    return offsets, positions


def _refine_block(
    obj: StoredObject, offsets: list[int], positions: list[int], b: int, frame_index: FrameIndexReader
) -> tuple[list[int], list[int]]:
    """Insert the frames strictly inside block `b` (between anchors b and b+1)."""
    if offsets[b + 1] - offsets[b] <= 1:
        return offsets, positions
    inner_offsets: list[int] = []
    inner_positions: list[int] = []
    for offset, pos in frame_index(obj, positions[b], positions[b + 1]):
        last_offset = inner_offsets[-1] if inner_offsets else offsets[b]
        last_pos = inner_positions[-1] if inner_positions else positions[b]
        if last_offset < offset < offsets[b + 1] and last_pos < pos < positions[b + 1]:
            inner_offsets.append(offset)
            inner_positions.append(pos)
    return (offsets[: b + 1] + inner_offsets + offsets[b + 1 :],
            positions[: b + 1] + inner_positions + positions[b + 1 :])
