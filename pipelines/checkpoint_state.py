"""What a pipeline's Spark checkpoint says: its identity and each batch's planned offsets.

Spark writes `<checkpoint>/metadata` (`{"id": "<uuid>"}`) once, when a query first starts
on a new checkpoint, and keeps it for the checkpoint's lifetime: the id is therefore the
checkpoint's identity, and a deleted or replaced checkpoint gets a new one. The offsets log
`<checkpoint>/offsets/<batch id>` is written before a batch runs (`v1`, a metadata line, then
one line per source); the `danube` source's line is its `SourceOffset` JSON, the batch's
end-exclusive end positions. The batch's start positions are the previous entry's.

Files are read through Hadoop's FileSystem of the session (so `s3a://`, `abfss://` and
`dbfs:/` checkpoints work as they do for Spark itself), on the driver only.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Mapping

from pyspark.sql import SparkSession

from connectors.offsets import SourceOffset
from connectors.subscription_lock import LockToken

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointState:
    """One checkpoint location: its id (None while no query ever started on it) and last batch."""

    location: str
    query_id: str | None
    last_batch: int | None

    def describe(self) -> str:
        if self.query_id is None:
            return f"the checkpoint at {self.location} is new (no {self.location}/metadata)"
        known = "no batch yet" if self.last_batch is None else f"batches up to {self.last_batch}"
        return f"the checkpoint at {self.location} (id {self.query_id}) knows {known}"


@dataclass(frozen=True)
class PlannedRange:
    """Offsets `[start, end)` of one topic partition that a batch was planned to read.

    `start` is None for a topic the batch reads first (batch 0, or a new topic/partition):
    Spark does not log the stream's initial offset.
    """

    start: int | None
    end: int


class CheckpointFiles:
    """Read-only access to a checkpoint's files through the session's Hadoop FileSystem."""

    def __init__(self, spark: SparkSession, location: str) -> None:
        self.location = location.rstrip("/")
        jvm = spark._jvm  # classic sessions only: Spark Connect has no driver JVM here
        assert jvm is not None, "a classic session's driver JVM is up while the session is"
        self._jvm = jvm
        self._root = jvm.org.apache.hadoop.fs.Path(self.location)
        self._fs = self._root.getFileSystem(spark._jsparkSession.sessionState().newHadoopConf())

    def _path(self, name: str):
        return self._jvm.org.apache.hadoop.fs.Path(self._root, name)

    def read_text(self, name: str) -> str | None:
        path = self._path(name)
        if not self._fs.exists(path):
            return None
        stream = self._fs.open(path)
        try:
            return self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
        finally:
            stream.close()

    def batch_ids(self, folder: str) -> list[int]:
        """Batch ids present in `offsets` or `commits` (files named by number), ascending."""
        path = self._path(folder)
        if not self._fs.exists(path):
            return []
        names = [status.getPath().getName() for status in self._fs.listStatus(path)]
        return sorted(int(n) for n in names if n.isdigit())


def read_state(spark: SparkSession, location: str) -> CheckpointState:
    """The checkpoint's id and last planned batch (both None for a new or deleted checkpoint)."""
    files = CheckpointFiles(spark, location)
    query_id = parse_query_id(files.read_text("metadata"))
    batches = files.batch_ids("offsets")
    return CheckpointState(location, query_id, batches[-1] if batches else None)


def parse_query_id(text: str | None) -> str | None:
    """The `id` of a checkpoint's `metadata` file (None when there is no file)."""
    if not text or not text.strip():
        return None
    try:
        value = json.loads(text.strip().splitlines()[0])
    except ValueError:
        logger.warning("checkpoint metadata is not JSON: %r", text[:200])
        return None
    return value.get("id") if isinstance(value, dict) else None


def parse_source_offset(text: str | None) -> SourceOffset | None:
    """The `danube` source's offset in one offsets-log entry (None if none is there)."""
    if not text:
        return None
    for line in text.splitlines()[2:]:
        try:
            return SourceOffset.from_json(line)
        except ValueError:
            continue  # another source's offset, or "-"
    return None


class OffsetsLog:
    """The `danube` source's entries of one checkpoint's offsets log, as a query's sink reads them.

    Spark writes a batch's entry before the batch runs and never rewrites it while the query
    runs, so each entry is read once (through the JVM's Hadoop FileSystem, a dozen round trips)
    and kept: batch N's end is batch N+1's start. Entries of batches more than one behind the
    last one read are dropped."""

    def __init__(self, spark: SparkSession, location: str) -> None:
        self._files = CheckpointFiles(spark, location)
        self._entries: dict[int, SourceOffset | None] = {}

    def entry(self, batch_id: int) -> SourceOffset | None:
        if batch_id not in self._entries:
            self._entries[batch_id] = parse_source_offset(self._files.read_text(f"offsets/{batch_id}"))
            for old in [b for b in self._entries if b < batch_id - 1]:
                del self._entries[old]
        return self._entries[batch_id]

    def planned_batch(self, batch_id: int) -> tuple[dict[str, PlannedRange] | None, LockToken | None]:
        """Per topic partition, the offsets batch `batch_id` was planned to read (None: not
        logged), and the subscription lock that planned it (its cursor commit is conditioned on
        that lock: `connectors.subscription_lock`)."""
        end = self.entry(batch_id)
        if end is None:
            return None, None
        start = self.entry(batch_id - 1) if batch_id > 0 else None
        return ranges_between(dict(start.positions) if start else {}, end.positions), end.lock


def ranges_between(start: Mapping[str, int], end: Mapping[str, int]) -> dict[str, PlannedRange]:
    """Planned ranges from two offsets-log entries; topics missing from `start` start unknown."""
    return {topic: PlannedRange(start.get(topic), stop) for topic, stop in end.items()}


def missing_offsets(planned: Mapping[str, PlannedRange], first_and_rows: Mapping[str, tuple[int, int]]) -> dict[str, int]:
    """Offsets inside the planned ranges that the batch does not hold, per topic partition.

    `first_and_rows[t]` is (first offset read, rows read) for each topic with rows. A range of
    unknown start is counted from its first row, so a loss at the very head of a topic's first
    batch is not seen here (the connector still logs it). Zero counts are left out.
    """
    missing: dict[str, int] = {}
    for topic, rng in planned.items():
        first, rows = first_and_rows.get(topic, (None, 0))
        start = rng.start if rng.start is not None else first
        if start is None:
            continue
        lost = max(0, rng.end - start - rows)
        if lost:
            missing[topic] = lost
    return missing
