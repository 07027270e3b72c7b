"""How far a subscription is behind: messages, bytes and milliseconds per topic.

The stream reports it in query progress and the subscription records; the topic inspector
shows it for any subscription. Computed from topic snapshots: bytes from what the planner
would read for the backlog, milliseconds from two publish times read through the executors'
task reader (a few index intervals of frames each, every byte CRC-checked).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from connectors.snapshot import TopicSnapshot

logger = logging.getLogger(__name__)

Lag = dict[str, dict[str, int]]


def measure_lag(begin: Mapping[str, int], latest: Mapping[str, int], snapshots: Mapping[str, "TopicSnapshot"],
                publish_times: dict[tuple[str, int], int] | None = None, *,
                window: Mapping[str, int] | None = None, heads: Mapping[str, "TopicSnapshot"] | None = None) -> Lag:
    """Per topic: messages, bytes and milliseconds the subscription is behind.

    `bytes` is what the planner would read for the backlog (from descriptor sizes, index
    entries and WAL frame positions); `ms` is the newest message's publish_time minus that of
    the last message read (or of the first unread one when nothing was read yet). Either is
    left out when a range cannot be planned (data loss is reported when it is read).
    `publish_times` memoises the publish times read, so a stream reads one new message per
    topic and trigger (the last batch's newest is this batch's last read).

    A stream plans a window of a long backlog per trigger (`window`: where each topic's
    `snapshots` end, below `latest` for such a backlog): its `bytes` then count up to there,
    and `bytesUpTo` says where that is; the newest publish time comes from `heads` (a snapshot
    of such a topic's last offset).
    """
    memo = publish_times if publish_times is not None else {}
    lag: Lag = {}
    for topic, end in sorted(latest.items()):
        start = begin[topic]
        entry = {"messages": max(0, end - start), "bytes": 0, "ms": 0}
        if end > start:
            snap = snapshots[topic]
            counted = min(end, window[topic]) if window is not None and topic in window else end
            _put(entry, "bytes", _backlog_bytes(snap, start, counted))
            if counted < end:
                entry["bytesUpTo"] = counted
                newest = _memo_publish_time(memo, heads[topic], end - 1) if heads and topic in heads else None
            else:
                newest = _memo_publish_time(memo, snap, end - 1)
            read = _memo_publish_time(memo, snap, start - 1) if start > 0 else None
            read = read if read is not None else _memo_publish_time(memo, snap, start)
            _put(entry, "ms", None if newest is None or read is None else max(0, newest - read))
        lag[topic] = entry
    return lag


def _put(entry: dict[str, int], key: str, value: int | None) -> None:
    if value is None:
        del entry[key]
    else:
        entry[key] = value


def _plan(snap: "TopicSnapshot", start: int, end: int) -> list | None:
    import dataclasses

    from connectors.planner import plan_tasks
    from danube_core.errors import DataLossError

    snap = dataclasses.replace(snap, reused=[])  # reuse is reported when the batch is planned
    try:
        plan = plan_tasks({snap.topic: snap}, {snap.topic: start}, {snap.topic: end},
                          max_partition_bytes=_UNSPLIT, fail_on_data_loss=True)
    except DataLossError:
        return None
    return plan.tasks


def _backlog_bytes(snap: "TopicSnapshot", start: int, end: int) -> int | None:
    tasks = _plan(snap, start, end)
    if tasks is None:
        return None
    sizes = {obj.url: obj.size for obj in snap.objects}
    return sum((t.byte_end if t.byte_end is not None else sizes.get(t.url, t.byte_start)) - t.byte_start for t in tasks)


_MEMO_ENTRIES = 4096


def _memo_publish_time(memo: dict[tuple[str, int], int], snap: "TopicSnapshot", offset: int) -> int | None:
    key = (snap.topic, offset)
    if key not in memo:
        value = _publish_time(snap, offset)
        if value is None:
            return None
        if len(memo) >= _MEMO_ENTRIES:
            memo.clear()
        memo[key] = value
    return memo[key]


def _publish_time(snap: "TopicSnapshot", offset: int) -> int | None:
    from connectors.task_reader import read_task
    from danube_core.errors import DanubeError

    tasks = _plan(snap, offset, offset + 1)
    if not tasks:
        return None
    try:
        for batch in read_task(tasks[0], ["offset", "publish_time"], chunk_bytes=LAG_READ_BYTES):
            if batch.num_rows:
                return int(batch.column("publish_time")[0].as_py())
    except DanubeError as exc:
        logger.debug("no publish_time for %s offset %d: %s", snap.topic, offset, exc)
    return None


_UNSPLIT = 1 << 62  # one task per object / WAL run: only the byte total matters here
# Reads for one publish time start at the offset index entry before it: a few index intervals
# of frames, not the executors' 8 MiB chunks (every byte read is still CRC-checked).
LAG_READ_BYTES = 256 * 1024
