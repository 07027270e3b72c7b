"""Subscription cursors in etcd: commit after the sink, registration, lag, one live query.

The cursor `/topics/{T}/subscriptions/{sub}/cursor` holds the last offset the sink has durably
written (inclusive, a JSON number, as the broker writes it). It only moves forward
(compare-and-put), and it is never written ahead of the sink. Spark 4.2 calls a Python
stream's `commit(end)` only when it plans the next batch, and never for the last batch of a
run, so three paths commit it, all through `CursorWriter`:

* `DanubeCursorCommitter`, a `StreamingQueryListener` that `connectors.register(spark)`
  installs on the driver: every progress event carries the batch's end offset (JSON naming the
  subscription and the etcd endpoints) and is posted after the sink committed the batch;
* `commit_cursors(options, end_offsets)`, for a `foreachBatch` writer to call right after
  its own commit (the pipelines do); `end_offsets_of(batch_df)` gives the positions;
* the stream reader itself (`DanubeStreamReader._commit_finished_batch`): Spark plans a batch
  only after the previous one is in the checkpoint's commit log, so when it asks for the
  offsets after a batch this process planned, that batch's end is committed; and `commit(end)`
  when Spark calls it. This path needs no registration, so queries whose source Spark found on
  its own (Declarative Pipelines) stay current too, one trigger after each batch.

A subscription is consumed by at most one live query (`connectors.subscription_lock`): the
stream holds an etcd lease on `danube_core.keys.subscription_lock_key`, and a commit given the
batch's `LockToken` (every path above has it) moves the cursor in one transaction that also
compares the lock, so a query that lost its lock to another stops with
`SubscriptionLockLostError` instead of moving the cursor of the query that took it over.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Mapping

from pyspark.sql.streaming import StreamingQueryListener

from danube_core.errors import DanubeError, MetadataError, SubscriptionLockLostError
from danube_core.keys import cursor_key, subscription_key
from danube_core.metadata import MetadataStore
from danube_core.records import SubscriptionRecord, dump_cursor, dump_json, load_json, parse_cursor
from connectors.offsets import SourceOffset, cursor_values
from connectors.options import DanubeOptions, parse_etcd, parse_options
from connectors.subscription_lock import LockToken, holder_accepts, lock_lost

logger = logging.getLogger(__name__)

CONSUMER_NAME = "danube-spark"
EXCLUSIVE = 0  # SubscriptionRecord.subscription_type: one live query per subscription
_CAS_ATTEMPTS = 5


class CursorWriter:
    """Writes one subscription's cursors, records and lag through a metadata store."""

    def __init__(self, metadata: MetadataStore, subscription: str) -> None:
        self.metadata = metadata
        self.subscription = subscription
        self._registered: set[str] = set()
        # Cursor and lock values as this writer last read or wrote them. Every write compares
        # against them, so an outdated one costs a failed compare and a fresh read, never a
        # wrong write; a steady stream of commits therefore reads nothing from etcd.
        self._seen: dict[str, bytes | None] = {}

    def _read(self, key: str) -> bytes | None:
        if key not in self._seen:
            self._seen[key] = self.metadata.get(key)
        return self._seen[key]

    def commit(self, end: Mapping[str, int], lock: LockToken | None = None,
               guard: bytes | None = None) -> dict[str, int]:
        """Move each topic's cursor to `end[t] - 1` unless it is already there or beyond.

        With `lock` (the lock that planned the batch), each move is conditioned, in the same
        transaction, on that lock being held by it or by nobody; a lock another query holds
        raises `SubscriptionLockLostError` and nothing moves. Nobody holds it when the query
        ended and released it before a listener committed its last batch, or when its lease
        expired and no other query took over: the cursor then moves, forward only, over what
        this query's sink wrote, and no live owner's cursor is touched. `guard`: the lock
        key's value when the caller holds the lock itself (spares reading it). Returns the
        cursors actually written. End offsets are end-exclusive positions.
        """
        if guard is None and lock is not None:
            guard = self._guard(lock)
        written: dict[str, int] = {}
        for topic, cursor in sorted(cursor_values(end).items()):
            self.register(topic)
            moved, guard = self._advance(topic, cursor, lock, guard)
            if moved:
                written[topic] = cursor
        if written:
            logger.info("subscription %s: committed cursors %s", self.subscription, written)
        return written

    def _guard(self, lock: LockToken) -> bytes | None:
        """The lock key's value if `lock` holds it, None if nobody does; raises if another does."""
        raw = self._read(lock.key)
        if raw is not None and not holder_accepts(raw, lock):
            self._seen.pop(lock.key)  # read again before giving up on a later commit
            raise lock_lost(self.subscription, lock, raw, "does not move its cursors")
        return raw

    def _advance(self, topic: str, cursor: int, lock: LockToken | None,
                 guard: bytes | None) -> tuple[bool, bytes | None]:
        key = cursor_key(topic, self.subscription)
        value = dump_cursor(cursor)
        for _ in range(_CAS_ATTEMPTS):
            raw = self._read(key)
            if raw is not None and parse_cursor(raw, key) >= cursor:
                return False, guard
            if lock is None:
                moved = self.metadata.compare_and_put(key, raw, value)
            else:
                moved = self.metadata.guarded_put(key, raw, value, guard=(lock.key, guard)) is not None
            if moved:
                self._seen[key] = value
                return True, guard
            self._seen.pop(key, None)  # the cursor or the lock changed: read both again
            if lock is not None:
                self._seen.pop(lock.key, None)
                guard = self._guard(lock)
        raise MetadataError(f"etcd key {key!r}: cursor kept changing while committing {cursor}")

    def register(self, topic: str) -> None:
        """Create the subscription record `/topics{T}/subscriptions/{sub}` if it is missing."""
        if topic in self._registered:
            return
        record = SubscriptionRecord(None, CONSUMER_NAME, self.subscription, EXCLUSIVE)
        if self.metadata.put_if_absent(subscription_key(topic, self.subscription), record.to_json()):
            logger.info("registered subscription %s on %s", self.subscription, topic)
        self._registered.add(topic)

    def record_lag(self, topic: str, lag: Mapping[str, int]) -> None:
        """Store `lag` as an extra `lag` field of the subscription record (best effort).

        The broker ignores unknown fields and may overwrite the record when a consumer
        subscribes; a concurrent change makes this write skip, never clobber.
        """
        self.register(topic)
        key = subscription_key(topic, self.subscription)
        raw = self.metadata.get(key)
        if raw is None:
            return
        value = load_json(raw, key)
        if not isinstance(value, dict):
            return
        value["lag"] = {**lag, "updated_at": int(time.time())}
        self.metadata.compare_and_put(key, raw, dump_json(value))


def commit_cursors(
    options: DanubeOptions | Mapping[str, str],
    end_offsets: Mapping[str, int] | SourceOffset | str,
    *,
    metadata: MetadataStore | None = None,
    lock: LockToken | None = None,
) -> dict[str, int]:
    """Commit the cursors for a batch the caller's sink has durably written.

    `options`: the data source options of the stream (parsed or raw); `end_offsets`:
    end-exclusive positions per topic partition (e.g. from `end_offsets_of(df)`), or the
    source's end offset (`SourceOffset` or its JSON, from query progress or Spark's offsets
    log), which also names the lock that planned the batch. `lock` names it for bare
    positions: the cursors then move only while that lock is held, else
    `SubscriptionLockLostError` (stop the query). Pass `metadata` to reuse an etcd connection.
    Returns the cursors written.
    """
    parsed = options if isinstance(options, DanubeOptions) else parse_options(options)
    if parsed.subscription is None:
        raise MetadataError("commit_cursors: the options name no 'subscription' to commit under")
    positions = _positions(end_offsets)
    if lock is None and not isinstance(end_offsets, Mapping):
        lock = (SourceOffset.from_json(end_offsets) if isinstance(end_offsets, str) else end_offsets).lock
    store = metadata or parsed.etcd.connect()
    try:
        return CursorWriter(store, parsed.subscription).commit(positions, lock)
    finally:
        if metadata is None:
            store.close()


def _positions(end_offsets: Mapping[str, int] | SourceOffset | str) -> Mapping[str, int]:
    if isinstance(end_offsets, str):
        return SourceOffset.from_json(end_offsets).positions
    if isinstance(end_offsets, SourceOffset):
        return end_offsets.positions
    return end_offsets


def end_offsets_of(batch: Any) -> dict[str, int]:
    """End-exclusive positions of the rows of a micro-batch DataFrame (max offset + 1).

    Partition topics get their `-part-N` names back from the `topic` and `partition` columns.
    This runs a Spark job over `batch`: persist the batch first, or it is read twice.
    """
    from pyspark.sql import functions as F

    rows = batch.groupBy("topic", "partition").agg(F.max("offset").alias("last")).collect()
    positions: dict[str, int] = {}
    for row in rows:
        name = row["topic"] if row["partition"] is None else f"{row['topic']}-part-{row['partition']}"
        positions[name] = row["last"] + 1
    return positions


class DanubeCursorCommitter(StreamingQueryListener):
    """Commits the cursors of every `danube` source of every query, after each batch.

    It reads each source's end offset from the progress event; offsets that are not a danube
    source's (other sources) are ignored. `etcd_options` supplies credentials/TLS
    (`etcd.user`, `etcd.password`, `etcd.caCert`, ...) for the endpoints named in the offsets,
    which never carry secrets. Failures are logged, never raised: a listener cannot fail a query
    (a lost subscription lock stops it through the stream and the sink's commits instead).
    """

    def __init__(self, etcd_options: Mapping[str, str] | None = None) -> None:
        self.etcd_options = dict(etcd_options or {})
        self._writers: dict[tuple[str, str], CursorWriter] = {}

    def __getstate__(self) -> dict:
        # Spark Connect pickles listeners to the server: open connections stay behind.
        return {"etcd_options": self.etcd_options, "_writers": {}}

    def add_credentials(self, etcd_options: Mapping[str, str]) -> None:
        """Use these `etcd.*` options from now on (connections made with the old ones close)."""
        self.etcd_options.update(etcd_options)
        writers, self._writers = self._writers, {}
        for writer in writers.values():
            writer.metadata.close()

    def onQueryStarted(self, event: Any) -> None:
        """Nothing to do until a batch has been written."""

    def onQueryIdle(self, event: Any) -> None:
        """No new batch, no new cursor."""

    def onQueryTerminated(self, event: Any) -> None:
        """Cursors were committed with each progress event."""

    def onQueryProgress(self, event: Any) -> None:
        for source in event.progress.sources:
            try:
                offset = SourceOffset.from_json(source.endOffset) if source.endOffset else None
            except ValueError:
                continue  # not a danube source
            if offset is None or offset.subscription is None or offset.endpoints is None:
                continue
            try:
                self._writer(offset.endpoints, offset.subscription).commit(offset.positions, offset.lock)
            except SubscriptionLockLostError as exc:
                logger.error("batch %s of query %s: %s", event.progress.batchId, event.progress.id, exc)
            except (DanubeError, ValueError) as exc:
                logger.warning("could not commit cursors of subscription %s after batch %s: %s",
                               offset.subscription, event.progress.batchId, exc)

    def _writer(self, endpoints: str, subscription: str) -> CursorWriter:
        key = (endpoints, subscription)
        if key not in self._writers:
            settings = parse_etcd({**self.etcd_options, "etcd.endpoints": endpoints})
            self._writers[key] = CursorWriter(settings.connect(), subscription)
        return self._writers[key]
