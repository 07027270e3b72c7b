"""Offsets by publish time, for `startingTimestamp` / `endingTimestamp` (as Kafka's offsetsForTimes).

Objects are binary-searched by their first frame's publish_time (client clocks: assumed to
grow roughly with offsets), then messages are read from the object found on, through the
same planner and task reader as any read, so every CRC and offset check applies.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from connectors.planner import plan_tasks
from connectors.snapshot import StoredObject, TopicSnapshot
from danube_core.errors import CorruptFrameError
from danube_core.objectstore import ObjectStore

TIMESTAMP_TASK_BYTES = 8 * 1024 * 1024
_FIRST_FRAME_PROBE = 64 * 1024


def offset_for_timestamp(snap: TopicSnapshot, store: ObjectStore, timestamp_ms: int, fail_on_data_loss: bool) -> int:
    """First offset of the snapshot's topic published at or after `timestamp_ms`, else latest."""
    from connectors.task_reader import read_task

    objects = snap.objects
    lo, hi = 0, len(objects)
    while lo < hi:
        mid = (lo + hi) // 2
        if first_publish_time(store, objects[mid]) >= timestamp_ms:
            hi = mid
        else:
            lo = mid + 1
    begin = objects[lo - 1].start_offset if lo else (
        objects[0].start_offset if objects else snap.wal_start or snap.latest_offset)
    plan = plan_tasks({snap.topic: snap}, {snap.topic: begin}, {snap.topic: snap.latest_offset},
                      max_partition_bytes=TIMESTAMP_TASK_BYTES, fail_on_data_loss=fail_on_data_loss)
    return next((o for task in plan.tasks for o in _offsets_at_or_after(
        read_task(task, ["offset", "publish_time"]), timestamp_ms)), snap.latest_offset)


def first_publish_time(store: ObjectStore, obj: StoredObject) -> int:
    """publish_time of an object's first frame (reads only that frame)."""
    from danube_core.arrow_decode import decode_frames
    from danube_core.frames import FRAME_HEADER, FRAME_HEADER_SIZE

    data = store.read_range(obj.url, 0, min(obj.size, _FIRST_FRAME_PROBE))
    if len(data) >= FRAME_HEADER_SIZE:
        length = FRAME_HEADER.unpack_from(data)[1]
        if len(data) < FRAME_HEADER_SIZE + length:
            data = store.read_range(obj.url, 0, FRAME_HEADER_SIZE + length)
    decoded = decode_frames(data, max_frames=1, columns=["publish_time"])
    decoded.raise_if_corrupt(obj.url)
    if decoded.batch.num_rows == 0:
        raise CorruptFrameError(obj.url, obj.start_offset, 0, "no whole frame at the object's start")
    return decoded.batch.column(0)[0].as_py()


def _offsets_at_or_after(batches, timestamp_ms: int) -> Iterable[int]:
    for batch in batches:
        times = batch.column("publish_time").to_numpy()
        hits = np.flatnonzero(times >= timestamp_ms)
        if hits.size:
            yield int(batch.column("offset")[int(hits[0])].as_py())
            return
