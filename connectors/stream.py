"""Streaming reads: the stream owns the offset lifecycle (as Kafka's `KafkaMicroBatchStream`).

Why one module of ~480 lines: Spark's stream reader contract is one class, and the order of its
calls (below) is the argument that every offset is read once; the work each step does lives in
other modules (the catalog, the planner, the cursor writer, `connectors.spark_compat`).

Spark runs this reader's driver-side methods in one long-lived Python process per query
(`initialOffset`, `latestOffset`, `partitions`, `commit`, ...) and pickles it for `read()` on
executors. The driver state (etcd connection, metadata cache, catalog, subscription lock) is
therefore opened lazily on the first driver-side call and never pickled.

The catalog reads a `LocalCache` of the keys of the query's own topics (`connectors.query_scope`:
the window of descriptors from the query's position to the head, `cur`, sealed states,
subscriptions, the cluster keys naming their owners, their namespace-index entries), loaded
once per topic and kept current by a watch, so a trigger plans from memory without etcd range
reads, and neither the query's start nor its memory grows with the rest of the cluster. Writes
(cursor commits, the lock, lag records) go to etcd, compared against the values the writer
last saw (`CursorWriter`), so a steady-state trigger reads nothing from etcd. A cache behind
etcd can only make a trigger see less: a plan that finds offsets missing is made again from
etcd (`plan_partitions(recheck=)`), and executors check what they read (CRC, offset
continuity) as they always do.

Offsets are `SourceOffset` JSON: end-exclusive positions per topic partition plus the
subscription and etcd endpoints, so the cursor-committing listener can act on a progress
event alone. Each `latestOffset(start, limit)`:

1. re-resolves the topics: topics and partitions created since the last batch join at their
   earliest offset;
2. reads the latest offsets, bounded by the Trigger.AvailableNow target if there is one;
3. measures and reports the lag (query progress `latestOffset`, INFO log, subscription record);
4. admits a batch: everything for `ReadAllAvailable`; otherwise the option limits together
   (pyspark has no composite read limit, so any other limit means "the configured ones"):
   `maxMessagesPerTrigger`, `maxBytesPerTrigger` (exact byte caps by the planner), and
   `minMessagesPerTrigger` which defers a batch until enough messages or `maxTriggerDelay`.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import TYPE_CHECKING, Iterator, Mapping

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from connectors.batch import MissingTopics, new_catalog, topics_of
from connectors.lag import measure_lag
from connectors.partitions import plan_partitions, read_partition
from connectors.offsets import SourceOffset, cap_at, message_counts, resolve_start, with_new_topics
from connectors.options import DanubeOptions
from danube_core.errors import ConfigError
from connectors.plain_errors import plain_config_errors, plain_iteration
from connectors.query_scope import PLAN_WINDOW_OBJECTS
from connectors.spark_compat import (
    ADMISSION_CONTROL,
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from connectors.snapshot import TopicSnapshot

logger = logging.getLogger(__name__)

LAG_RECORD_INTERVAL_S = 10.0  # how often the lag goes into the subscription records in etcd


class _DriverState:
    """What the long-lived driver-side process holds for one query."""

    def __init__(self, options: DanubeOptions) -> None:
        from connectors.cursor_commit import CursorWriter
        from connectors.query_scope import QueryScope
        from connectors.subscription_lock import SubscriptionLock
        from danube_core.cached_store import CachedMetadataStore

        assert options.subscription is not None  # require_stream() checked it
        self.metadata = options.etcd.connect()
        try:
            self.lock = SubscriptionLock(self.metadata, options.root_prefix, options.subscription)
        except BaseException:
            self.metadata.close()
            raise
        try:
            self.scope = QueryScope(self.metadata, options, name=f"stream-{options.subscription}").start()
        except BaseException:
            self.lock.release()
            self.metadata.close()
            raise
        # Reads come from the scope's cache (what the query's topics need), anything else from
        # etcd. The writer's reads wait for the cache to hold its own writes; the catalog's never
        # wait (it writes nothing, and no cursor or lag record changes a plan).
        self.catalog = new_catalog(options, CachedMetadataStore(self.metadata, self.scope.cache))
        self.etcd_catalog = new_catalog(options, self.metadata)  # re-checks a plan that finds a gap
        self.writer = CursorWriter(CachedMetadataStore(self.metadata, self.scope.cache), options.subscription)
        self.target: dict[str, int] | None = None  # Trigger.AvailableNow: read up to here
        self.last_batch_ms = time.monotonic() * 1000
        self.reported: dict | None = None
        self.lag_recorded_at = float("-inf")
        self.recorded_lag: dict[str, int] = {}  # topic -> the messages behind last written to etcd
        self.skipped: dict[str, int] = {}  # offsets skipped so far (failOnDataLoss=false)
        self.publish_times: dict[tuple[str, int], int] = {}  # (topic, offset) -> ms, for lag
        self.running_end: dict[str, int] | None = None  # end of the batch Spark planned last
        self.indexed: set[str] = set()  # topics seen in the namespace index during this query
        self.deleted: set[str] = set()  # of those, the ones whose index entry went away since
        self.latest_seen: dict[str, int] = {}  # each topic's latest offset at the last trigger
        self.missing = MissingTopics(options)

    def topics(self, options: DanubeOptions) -> list[str]:
        """The topic partitions the query reads now (not the ones deleted while it read them),
        their keys cached from here on; a named topic that does not exist yet is named once
        (`MissingTopics`) and gets its subscription record once it does."""
        topics = [t for t in topics_of(self.catalog, options) if t not in self.deleted]
        self.scope.follow(topics)
        for topic in self.missing.check(self.catalog, topics):
            self.writer.register(topic)
        return topics

    def reads_from(self, positions: Mapping[str, int]) -> None:
        """The query reads each topic from its position: the run audit and the cached window
        reach down to it (once), and move up behind it."""
        self.scope.lower_to_restart()
        for topic, offset in positions.items():
            self.catalog.read_from(topic, offset)
            self.scope.reach(topic, offset, self.catalog.covering_start)
        self.scope.advance(positions)

    def close(self) -> None:
        try:
            self.lock.release()
        finally:
            self.scope.close()
            self.metadata.close()


class DanubeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`spark.readStream.format("danube")`; see `connectors.source.DanubeDataSource`."""

    def __init__(self, options: DanubeOptions) -> None:
        options.require_stream()
        if not ADMISSION_CONTROL:
            _refuse_trigger_limits(options)
        self.options = options
        self._state: _DriverState | None = None
        self._initial: dict | None = None
        # Spark 4.0/4.1 call `latestOffset()` without the batch's start: the stream keeps it,
        # the end of the last batch it returned or was asked to plan (a restarted query's
        # replayed or latest-seen batch arrives through `partitions`).
        self._own_start: dict | None = None

    def __getstate__(self) -> dict:
        return {"options": self.options, "_state": None, "_initial": None, "_own_start": None}

    # ---- driver side ----------------------------------------------------------------------

    def _driver(self) -> _DriverState:
        if self._state is None:
            self._state = _DriverState(self.options)
            _release_on_sigterm(self)
        self._state.lock.check()
        return self._state

    def _offset(self, positions: Mapping[str, int]) -> dict:
        lock = self._state.lock.token if self._state is not None else None
        return SourceOffset(dict(positions), self.options.subscription, self.options.etcd.endpoints,
                            lock=lock).to_json_dict()

    @plain_config_errors
    def initialOffset(self) -> dict:
        """Where a query without a checkpoint starts; resolved once, so each of Spark's calls
        gets the same (Spark 4.0/4.1 ask `latestOffset()` first and this only afterwards)."""
        if self._initial is None:
            self._initial = self._resolve_initial()
        if self._own_start is None:
            self._own_start = self._initial
        return self._initial

    def _resolve_initial(self) -> dict:
        state = self._driver()
        topics = state.topics(self.options)
        starting = self.options.starting_for(streaming=True)
        if starting.kind in ("latest", "cursor"):
            for topic in topics:  # audited from the head, or from a cursor once it is read
                state.catalog.read_from(topic, None)
        start = resolve_start(starting, topics, state.catalog, self.options.subscription)
        state.reads_from(start)
        logger.info("subscription %s starts at %s", self.options.subscription, start)
        return self._offset(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        o = self.options
        if o.max_messages_per_trigger is not None:
            return ReadMaxRows(o.max_messages_per_trigger)
        if o.max_bytes_per_trigger is not None:
            return ReadMaxBytes(o.max_bytes_per_trigger)
        if o.min_messages_per_trigger is not None:
            return ReadMinRows(o.min_messages_per_trigger)
        return ReadAllAvailable()

    @plain_config_errors
    def prepareForTriggerAvailableNow(self) -> None:
        state = self._driver()
        topics = state.topics(self.options)
        state.target = state.catalog.latest_offsets(topics)
        logger.info("Trigger.AvailableNow: subscription %s reads up to %s", self.options.subscription, state.target)

    @plain_config_errors
    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict:
        """The end of the next batch. Spark 4.2+ passes the batch's start and read limit; 4.0 and
        4.1 pass neither (`connectors.spark_compat`): the batch then starts where the last one
        ended and reads everything available, since one of those calls may be the only batch of
        a Trigger.AvailableNow run."""
        if start is None:
            # Before any batch of this process: a restarted query's position arrives through
            # `partitions` (Spark's latest-seen offset), a new query's is its initial offset.
            begin = self._own_start if self._own_start is not None else self.initialOffset()
            self._own_start = self._latest_offset(begin, ReadAllAvailable(), window_objects=None)
            return self._own_start
        assert limit is not None
        return self._latest_offset(start, limit, window_objects=PLAN_WINDOW_OBJECTS)

    def _latest_offset(self, start: dict, limit: ReadLimit, window_objects: int | None) -> dict:
        state = self._driver()
        self._commit_finished_batch(state, SourceOffset.from_json_dict(start))
        state.catalog.hold_heads()  # one view of each topic for this trigger, `partitions` included
        positions = SourceOffset.from_json_dict(start).positions
        topics = self._drop_deleted(state, state.topics(self.options), positions)
        state.reads_from({t: o for t, o in positions.items() if t not in state.deleted})
        begin = with_new_topics(positions, topics, state.catalog)
        latest = {**begin, **state.catalog.latest_offsets(topics)}
        state.latest_seen.update(latest)
        if state.target is not None:
            latest = {**begin, **cap_at(latest, state.target)}
        # A batch plans at most a window of objects per topic: a stream far behind on a long
        # history holds and plans a bounded part of it per trigger, not the whole backlog.
        window = (dict(latest) if window_objects is None else
                  {t: state.catalog.window_end(t, begin[t], e, window_objects) for t, e in latest.items()})
        snapshots = state.catalog.snapshots({t: max(0, min(begin[t], e) - 1) for t, e in window.items()}, window)
        self._report_restarts(state, begin, snapshots)
        self._report_lag(state, begin, latest, window, snapshots)
        # Never back below the position: a head below it is a view a moment behind etcd (a
        # deletion not seen yet) or a new run that has not reached it (reported above).
        end = {t: max(e, begin[t]) for t, e in self._admit(state, begin, latest, window, limit, snapshots).items()}
        if self.options.lost_offsets_location is not None and not self.options.fail_on_data_loss:
            from connectors.loss_records import fold

            fold(self.options, state.skipped)
        self._report_losses(state, begin, end, snapshots)
        if end == SourceOffset.from_json_dict(start).positions:
            return start  # nothing new: the same offset (a restarted run's lock must not look like data)
        return self._offset(end)

    def _drop_deleted(self, state: _DriverState, topics: list[str], positions: Mapping[str, int]) -> list[str]:
        """`topics` without those deleted while this query read them (§6.7: their namespace-index
        entry is gone; the broker also deletes their storage keys and WAL). The offsets the query
        knew of and had not read are data loss, named (or skipped and counted); a deleted topic
        is not read again until it is created anew."""
        from connectors.data_loss import report
        from danube_core.keys import namespace_topic_key

        present = state.catalog.indexed([*topics, *positions, *state.deleted])
        state.indexed |= present
        if state.deleted & present:  # created anew: read again (its offsets restart, reported as such)
            state.deleted -= present
            topics = state.topics(self.options)
        for topic in sorted(state.indexed - present - state.deleted):
            state.deleted.add(topic)
            first = positions.get(topic)
            if first is None:
                continue
            stop = max(first, state.latest_seen.get(topic, first))
            why = (f"the topic was deleted while this query read it (its namespace-index entry "
                   f"{namespace_topic_key(topic)} is gone): offsets from {first} on are not read")
            if stop == first:
                logger.warning("subscription %s: topic %s: %s", self.options.subscription, topic, why)
                continue
            lost = report(topic, first, stop, why, fail_on_data_loss=self.options.fail_on_data_loss)
            state.skipped[topic] = state.skipped.get(topic, 0) + lost.count
        state.scope.forget(state.deleted)
        return [t for t in topics if t not in state.deleted]

    def _commit_finished_batch(self, state: _DriverState, start: SourceOffset) -> None:
        """Commit the cursors of the batch that ended at `start`, if this process planned it.

        Spark runs one batch at a time and plans the next (this call) only after the last one's
        sink commit is in the checkpoint's commit log, so a batch whose end is this call's
        start is durably written. This keeps the cursor current without the listener that
        `connectors.register(spark)` installs (a query found by Spark's data source discovery,
        as in Declarative Pipelines), including after the last batch of a Trigger.AvailableNow
        run, which Spark never passes to `commit()`. The listener's and `commit()`'s writes are
        the same forward-only compare-and-put guarded by the batch's lock, so the paths never
        move a cursor back nor move one for a query that lost the subscription.
        """
        from danube_core.errors import DanubeError

        if state.running_end is None or dict(start.positions) != state.running_end:
            return
        try:
            state.writer.commit(start.positions, start.lock, guard=state.lock.value_if_holding(start.lock))
            state.running_end = None
        except DanubeError as exc:
            if not exc.retriable:  # a lost lock stops the query
                raise
            logger.warning("subscription %s: could not commit cursors %s (retried next trigger): %s",
                           self.options.subscription, start.positions, exc)

    def _report_restarts(self, state: _DriverState, begin: Mapping[str, int],
                         snapshots: Mapping[str, "TopicSnapshot"]) -> None:
        """A run that began while the query was past its first offset: the new run's offsets
        below the query's position are never read (the real broker restarted at 0, §6.6)."""
        from connectors.data_loss import report

        for topic, snap in snapshots.items():
            first = snap.restarted_at
            if first is None:
                continue
            state.publish_times.clear()  # offsets now name other messages
            if topic in begin and first < begin[topic]:
                lost = report(topic, first, begin[topic],
                              f"the topic's offsets restarted at {first} (a new run of the topic) while this "
                              f"query was at {begin[topic]}: the new run's messages below it are never read",
                              fail_on_data_loss=self.options.fail_on_data_loss)
                state.skipped[topic] = state.skipped.get(topic, 0) + lost.count

    def _report_losses(self, state: _DriverState, begin: dict[str, int], end: dict[str, int],
                       snapshots: dict[str, "TopicSnapshot"]) -> None:
        """Query progress names what this query cannot read: offsets skipped (so far and in this
        batch, by reuse) and tails held by WALs it cannot reach."""
        assert state.reported is not None
        skipped = dict(state.skipped)
        if not self.options.fail_on_data_loss:
            for topic, snap in snapshots.items():
                reused = sum(max(0, min(r.stop, end.get(topic, 0)) - max(r.start, begin.get(topic, 0)))
                             for r in snap.reused)
                if reused:
                    skipped[topic] = skipped.get(topic, 0) + reused
        if skipped:
            state.reported["skippedOffsets"] = dict(sorted(skipped.items()))
        unread = {t: snap.unread_tail for t, snap in snapshots.items() if snap.unread_tail is not None}
        if unread:
            state.reported["unreadTail"] = dict(sorted(unread.items()))
        if state.missing.now:
            state.reported["missingTopics"] = list(state.missing.now)

    def _admit(
        self, state: _DriverState, begin: dict[str, int], latest: dict[str, int], window: dict[str, int],
        limit: ReadLimit, snapshots: dict[str, "TopicSnapshot"],
    ) -> dict[str, int]:
        """The batch's end: within the planning `window` (`latest` where the backlog fits in it),
        bounded by the read limits."""
        from connectors.planner import cap_end_offsets

        if isinstance(limit, ReadAllAvailable):
            return window
        o = self.options
        now_ms = time.monotonic() * 1000
        if o.min_messages_per_trigger is not None and state.target is None:
            available = sum(message_counts(begin, latest).values())
            waited = now_ms - state.last_batch_ms
            if available < o.min_messages_per_trigger and waited < o.max_trigger_delay_ms:
                logger.debug("deferring batch: %d < minMessagesPerTrigger=%d after %.0f ms",
                             available, o.min_messages_per_trigger, waited)
                return begin
        max_messages = limit.max_rows if isinstance(limit, ReadMaxRows) else o.max_messages_per_trigger
        max_bytes = limit.max_bytes if isinstance(limit, ReadMaxBytes) else o.max_bytes_per_trigger
        end = cap_end_offsets(begin, window, snapshots, max_messages=max_messages, max_bytes=max_bytes,
                              frame_index=state.catalog.read_frame_index)
        if end != begin:
            state.last_batch_ms = now_ms
        return end

    def _report_lag(
        self, state: _DriverState, begin: dict[str, int], latest: dict[str, int], window: dict[str, int],
        snapshots: dict[str, "TopicSnapshot"],
    ) -> None:
        beyond = {t: e for t, e in latest.items() if window[t] < e}  # backlogs longer than the window
        heads = state.catalog.snapshots({t: e - 1 for t, e in beyond.items()}) if beyond else {}
        lag = measure_lag(begin, latest, snapshots, state.publish_times, window=window, heads=heads)
        state.reported = SourceOffset(latest, lag=lag).to_json_dict()
        behind = {t: v for t, v in lag.items() if v["messages"]}
        logger.info("subscription %s lag: %s", self.options.subscription, behind or "none")
        now = time.monotonic()
        due = now - state.lag_recorded_at >= LAG_RECORD_INTERVAL_S  # etcd writes, so not every batch
        for topic, value in lag.items():
            # Caught up is written at once: a query that ends (AvailableNow) or idles within the
            # interval would otherwise leave the backlog it started with as its recorded lag.
            caught_up = value["messages"] == 0 and state.recorded_lag.get(topic) != 0
            if (due or caught_up) and topic not in state.missing.now:  # no record under a topic that does not exist
                state.writer.record_lag(topic, value)
                state.recorded_lag[topic] = value["messages"]
        if due:
            state.lag_recorded_at = now

    def reportLatestOffset(self) -> dict | None:
        return self._state.reported if self._state is not None else None

    @plain_config_errors
    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        state = self._driver()
        end_offset = SourceOffset.from_json_dict(end)
        state.lock.adopt(end_offset.lock)  # a batch planned by this query's earlier run, replayed
        stop = end_offset.positions
        begin = with_new_topics(SourceOffset.from_json_dict(start).positions, stop, state.catalog)
        state.running_end = dict(stop)  # committed when Spark plans the next batch from it
        self._own_start = end
        partitions = plan_partitions(state.catalog, self.options, begin, stop, state.skipped, recheck=state.etcd_catalog)
        if self.options.lost_offsets_location is None or self.options.fail_on_data_loss:
            return list(partitions)
        from connectors.loss_records import location_storage_options, record_url

        location, storage = self.options.lost_offsets_location, location_storage_options(self.options)
        for partition in partitions:
            partition.loss_record = record_url(location, begin, stop, partition.value)
            partition.loss_storage_options = storage
        return list(partitions)

    def commit(self, end: dict) -> None:
        state = self._driver()
        offset = SourceOffset.from_json_dict(end)
        state.lock.adopt(offset.lock)
        state.writer.commit(offset.positions, offset.lock, guard=state.lock.value_if_holding(offset.lock))
        if state.running_end == dict(offset.positions):
            state.running_end = None  # committed: the next latestOffset has nothing left to commit

    def stop(self) -> None:
        if self._state is not None:
            state, self._state = self._state, None
            state.close()

    # ---- executor side --------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator["pa.RecordBatch"]:
        return plain_iteration(read_partition(partition, self.options.include_source, self.options.columns))


def _refuse_trigger_limits(options: DanubeOptions) -> None:
    """Spark 4.0/4.1 give a Python stream no read limit and run Trigger.AvailableNow as one batch
    (`connectors.spark_compat`): a cap applied by the source would end such a run early and
    read the rest never, so a per-trigger limit is refused rather than ignored."""
    from connectors import options as names
    from connectors.spark_compat import ADMISSION_CONTROL_SINCE, SPARK_VERSION

    limits = {names.MAX_MESSAGES_PER_TRIGGER: (options.max_messages_per_trigger, " (or maxOffsetsPerTrigger)"),
              names.MAX_BYTES_PER_TRIGGER: (options.max_bytes_per_trigger, ""),
              names.MIN_MESSAGES_PER_TRIGGER: (options.min_messages_per_trigger, " (or minOffsetsPerTrigger)")}
    for key, (value, alias) in limits.items():
        if value is not None:
            raise ConfigError(
                f"option {key!r}{alias} needs Spark {ADMISSION_CONTROL_SINCE} or later, which lets a Python "
                f"stream limit its batches; this is Spark {SPARK_VERSION}, where every trigger reads all "
                f"available messages: remove the option, or run on Spark {ADMISSION_CONTROL_SINCE}+")


def _release_on_sigterm(reader: DanubeStreamReader) -> None:
    """Release the subscription lock when Spark stops the source's Python process.

    Spark ends that process with SIGTERM when the query stops, without calling `stop()`;
    without this the lock would only go away when its lease expires.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: object) -> None:
        # WARNING, so it reaches the driver's log (this process logs nothing below): a source
        # process ending while its query runs shows here whether it was told to.
        logger.warning("source process %d of subscription %s: SIGTERM, releasing the lock and exiting",
                       os.getpid(), reader.options.subscription)
        reader.stop()
        signal.signal(signal.SIGTERM, previous if callable(previous) else signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)
