"""The foreachBatch writer: one micro-batch -> target + quarantine in Delta, exactly once, then the cursor.

Order per batch, and why it gives exactly-once:

1. decode and validate the batch. The decoded rows are cached, and so are the source's rows
   where the decoder reads them more than once (a part per schema version), so the topic is
   read once per batch; one pass (observed metrics) gives the offset spans and the decode
   failures, and collects what great-expectations' pandas engine reads when the batch is small
   enough for it; great-expectations names the rows it rejects, so no further job counts anything;
2. append the valid rows to the target and the failing rows to the quarantine table (the two
   writes side by side: either may land first), each with Delta's idempotent-write options
   `txnAppId` = pipeline name and `txnVersion` = batch id.
   Spark replays a batch with the same id and the same offsets after a crash, and Delta skips
   a write whose (appId, version) its log has already committed, so a replay adds nothing to a
   table the first attempt reached and completes the one it did not. To answer that, Delta
   needs the table's state, which it computes with Spark jobs for every new version; after each
   write a background thread has it computed for the next one (`pipelines.delta_state`);
3. only then commit the subscription cursors in etcd (`connectors.cursor_commit`): the cursor
   never runs ahead of what Delta holds. The commit compares the subscription lock named in the
   batch's offset (Spark's offsets log) in the same etcd transaction: a pipeline whose lock lease
   was lost stops with `SubscriptionLockLostError` rather than move another owner's cursor;
4. if the pipeline feeds a speed-layer dataset (`speedlayer:` in its file), announce the
   target's new version to it (`pipelines.speedlayer_feed`; best effort, never fails the batch).

Each commit's `userMetadata` names the batch's offset ranges per topic partition and the
objects they were read from (`DESCRIBE HISTORY` shows where every version came from), the id
and location of the checkpoint that planned it, the split decision, the offsets skipped, the
rows in, written and quarantined by reason, and when the batch started (`commit_metadata`).

What makes step 2 hold whatever happens between attempts (`pipelines.batch_trail`):

* Delta skips a write whose txnVersion is at or below the last one recorded for the app id,
  and a new checkpoint restarts batch ids at 0. Before writing a batch the sink compares the
  checkpoint (its id, from `<checkpoint>/metadata`) with each table's last commit of the
  pipeline and stops with `CheckpointMismatchError` if a table holds batches the checkpoint
  does not know or that another checkpoint wrote: nothing is written, no cursor moves;
* a crash between the target and the quarantine write leaves the batch half written. Its
  replay is split with the decision recorded in the commit that did land (decode settings,
  schema id, the version used for messages naming none, the suite's rules), not with
  today's, so every offset ends in exactly one table, once.

Offsets skipped under failOnDataLoss=false are counted here, wherever they were found (the
driver plans around lost ranges; executors skip corrupt or missing data and can only log
it): the batch's planned ranges come from the checkpoint's offsets log (`<checkpoint>/offsets/
<batch id>` and the entry before), and every planned offset the batch does not hold was
skipped. The count goes into the `BatchReport` (`lost_offsets`), `PipelineMetrics.totals()
["lost"]`, a WARNING log line and the commit's `userMetadata` (`lost`); the cursors move to the
planned end, past the skipped offsets, as the progress listener's do.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, Callable, Mapping

from pyspark import InheritableThread
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from connectors.cursor_commit import commit_cursors
from connectors.subscription_lock import LockToken
from danube_core.metadata import MetadataStore
from pipelines.batch_hooks import NO_HOOKS, BatchHooks
from pipelines.batch_summary import collected_columns, decodable_rows, summarize, summarize_and_collect
from pipelines.batch_trail import SplitDecision, TableTrail, check_checkpoint, pipeline_tables, read_trail
from pipelines.checkpoint_state import CheckpointState, OffsetsLog, PlannedRange, missing_offsets, read_state
from pipelines.config import PipelineConfig, TableConfig
from pipelines.decode import DECODE_ERROR, META_COLUMNS, PAYLOAD, Decoder
from pipelines.delta_state import TableStateWarmer
from pipelines.expectations import FAILED, BatchQuality, QualityGate, mark_failures, no_failures
from pipelines.expressions import ExpressionCache
from pipelines.metrics import BatchReport, OffsetSpan, PipelineMetrics
from pipelines.subject_schemas import SubjectSchemas
from pipelines.speedlayer_feed import CommitAnnouncer, feed_etcd_settings

logger = logging.getLogger(__name__)

QUARANTINE_EXTRA = ("_pipeline", "_batch_id", "_quarantined_at")


class DeltaBatchWriter:
    """Callable for `writeStream.foreachBatch`: writes one batch as described in the module doc."""

    def __init__(
        self,
        config: PipelineConfig,
        decoder: Decoder,
        gate: QualityGate | None,
        reader_options: Mapping[str, str],
        metadata: MetadataStore,
        metrics: PipelineMetrics,
        clock: Callable[[], float] = time.monotonic,
        hooks: BatchHooks = NO_HOOKS,
    ) -> None:
        self.config = config
        self.decoder = decoder
        self.gate = gate
        self.reader_options = dict(reader_options)
        self.metadata = metadata
        self.metrics = metrics
        self.clock = clock
        self.hooks = hooks  # the fault battery's, else nothing (`pipelines.batch_hooks`)
        self._checkpoint_id: tuple[str | None] | None = None  # read once: fixed for the query's life
        self._offsets: OffsetsLog | None = None
        self.lock: LockToken | None = None  # the subscription lock that planned the last batch
        self._trails: dict[str, TableTrail] | None = None  # per table location, kept current
        self._replay_tools: dict[str, tuple[Decoder, QualityGate | None]] = {}
        self.announcer = _announcer(config, metadata, self.reader_options)
        self.warmer = TableStateWarmer()  # the next write's Delta state, computed off the batch's path
        self.expressions = ExpressionCache()  # the batch's columns and conditions, built once per query

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        timings: dict[str, float] = {}
        started = self.clock()
        started_ms = int(time.time() * 1000)  # wall clock, as Delta's commit timestamps
        spark = batch.sparkSession
        checkpoint = self._checkpoint(spark, batch_id)
        trails = self._load_trails(spark)
        check_checkpoint(self.config.name, checkpoint, trails.values(), batch_id)
        decision, replayed = self._decision(trails, batch_id)
        decoder, gate = self._tools(decision)
        prepared = decoder.prepare(batch)  # the decoder persists it if its plan reads it more than once
        decoded: DataFrame | None = None
        try:
            decoded = decoder.decode(prepared, (decision.schema_id, decision.default_version)).persist()
            planned, lock = self._offsets_log(spark).planned_batch(batch_id)
            self.lock = lock or self.lock
            columns = collected_columns(gate, decoded, planned)
            if planned and columns:
                summary, collected = summarize_and_collect(decoded, planned.keys(), columns, self.expressions)
            else:
                summary, collected = summarize(decoded, planned.keys() if planned else None, self.expressions), None
            spans = summary.spans
            lost = missing_offsets(planned or {}, {t: (s.start, s.rows) for t, s in spans.items()})
            timings["decode"] = self.clock() - started
            marked, quality = self._validate(decoded, gate, timings, summary.rows - summary.decode_failures, collected)
            counts = summary.counts(quality)
            mark = self.clock()
            metadata = commit_metadata(self.config.name, batch_id, spans, checkpoint=checkpoint,
                                       decision=decision, lost=lost, counts=counts,
                                       reasons=summary.quarantine_reasons(quality), started_ms=started_ms)
            written = self._write_tables(marked, counts, quality, batch_id, metadata)
            self.hooks.at("after_quarantine_write")
            self._remember(written, checkpoint, batch_id, decision, spans)
            timings["write"] = self.clock() - mark
            mark = self.clock()
            cursors = commit_cursors(self.reader_options, cursor_ends(spans, planned),
                                     metadata=self.hooks.cursor_store(self.metadata), lock=lock)
            timings["cursor"] = self.clock() - mark
            if self.announcer is not None and self.config.target.location in written:
                mark = self.clock()
                announced = self.announcer.announce()
                self.metrics.announced += int(announced)
                self.metrics.announce_failures += int(not announced)
                timings["announce"] = self.clock() - mark
        finally:
            if decoded is not None:
                decoded.unpersist()
            if prepared.is_cached:
                prepared.unpersist()
        report = BatchReport(batch_id, summary.rows, counts["valid"], counts["decode"],
                             counts["expectations"], spans, cursors, quality, timings, lost, replayed)
        self.metrics.record(report)
        if lost:
            logger.warning("pipeline %s batch %d: %d offsets of the planned ranges were skipped as lost "
                           "(failOnDataLoss=false), per topic: %s", self.config.name, batch_id, report.lost, lost)
        logger.info("pipeline %s batch %d: %d rows, %d valid, %d quarantined, %d lost, cursors %s (%.2fs)%s",
                    self.config.name, batch_id, report.rows, report.valid, report.quarantined, report.lost,
                    cursors, report.duration_s, " (replay, split as first attempted)" if replayed else "")

    def _checkpoint(self, spark: SparkSession, batch_id: int) -> CheckpointState:
        if self._checkpoint_id is None:
            self._checkpoint_id = (read_state(spark, self.config.checkpoint).query_id,)
        return CheckpointState(self.config.checkpoint, self._checkpoint_id[0], batch_id)

    def _offsets_log(self, spark: SparkSession) -> OffsetsLog:
        if self._offsets is None:
            self._offsets = OffsetsLog(spark, self.config.checkpoint)
        return self._offsets

    def _load_trails(self, spark: SparkSession) -> dict[str, TableTrail]:
        """Each table's last commit of this pipeline, read from Delta once per writer."""
        if self._trails is None:
            found = (read_trail(spark, table, self.config.name) for table in pipeline_tables(self.config))
            self._trails = {t.location: t for t in found if t is not None}
        return self._trails

    def _remember(self, written: list[str], checkpoint: CheckpointState, batch_id: int, decision: SplitDecision,
                  spans: Mapping[str, OffsetSpan]) -> None:
        """Keep the trails current: the tables just written now end at this batch."""
        offsets = {t: {"start": s.start, "end": s.end} for t, s in spans.items()}
        assert self._trails is not None
        for location in written:
            self._trails[location] = TableTrail(location, batch_id, checkpoint.query_id, checkpoint.location,
                                                decision, offsets)

    def _decision(self, trails: Mapping[str, TableTrail], batch_id: int) -> tuple[SplitDecision, bool]:
        """The first attempt's decision for a replayed batch; today's settings for a new one."""
        for trail in trails.values():
            if trail.last_batch == batch_id and trail.decision is not None:
                logger.info("pipeline %s batch %d is a replay (it reached %s): splitting it with the recorded "
                            "decision %s", self.config.name, batch_id, trail.location, trail.decision.fingerprint)
                return trail.decision, True
        schema_id, default_version = self.decoder.resolve_versions()
        suite = self.config.expectations
        return SplitDecision(self.config.decode, schema_id, default_version, suite.suite if suite else None,
                             tuple(suite.rules) if suite else ()), False

    def _tools(self, decision: SplitDecision) -> tuple[Decoder, QualityGate | None]:
        """Decoder and gate for `decision`: the configured ones unless the decision differs."""
        current = self.config.expectations
        same_suite = (decision.suite, decision.rules) == ((current.suite, tuple(current.rules)) if current else (None, ()))
        if decision.decode == self.config.decode and same_suite:
            return self.decoder, self.gate
        key = decision.fingerprint
        if key not in self._replay_tools:
            subject = decision.decode.subject
            schemas = SubjectSchemas(self.metadata, subject) if subject else None
            decoder = self.decoder if decision.decode == self.config.decode else Decoder(decision.decode, schemas)
            suite = decision.expectations()
            gate = self.gate if same_suite else (QualityGate(suite) if suite is not None else None)
            self._replay_tools[key] = (decoder, gate)
        return self._replay_tools[key]

    def _write_tables(self, marked: DataFrame, counts: Mapping[str, int], quality: BatchQuality | None,
                      batch_id: int, metadata: str) -> list[str]:
        """Target, quarantine and (optionally) the quality results, each idempotent per batch.

        The quarantine write runs beside the target write, on a thread that carries the batch's
        Spark job group (stopping the query cancels both): the two tables are independent, each
        write is idempotent on its own, and a replay completes whichever did not land, so their
        order does not matter, and a batch with failing rows no longer waits for two Delta
        commits in turn. Returns the locations written (a write Delta skipped as a replay counts
        as written)."""
        written = []
        quarantine = None
        if counts["decode"] + counts["expectations"]:
            rows = quarantine_rows(marked, self.config.name, batch_id, self.expressions)
            quarantine = _in_background(lambda: self._write(rows, self.config.quarantine, batch_id, metadata,
                                                            merge_schema=True))
        try:
            if counts["valid"]:
                with self.hooks.around("during_target_write"):
                    written.append(self._write(target_rows(marked, self.expressions), self.config.target, batch_id, metadata))
                self.hooks.at("after_target_write")
        except BaseException:
            if quarantine is not None:  # let it finish (or fail) before the batch fails
                try:
                    quarantine()
                except Exception as exc:
                    logger.warning("pipeline %s batch %d: the quarantine write failed too: %s",
                                   self.config.name, batch_id, exc)
            raise
        if quarantine is not None:
            written.append(quarantine())
        results = self.config.expectations.results if self.config.expectations else None
        if quality is not None and results is not None:
            written.append(self._write(results_frame(marked.sparkSession, self.config.name, batch_id, quality),
                                       results, batch_id, metadata, merge_schema=True))
        return written

    def _validate(self, decoded: DataFrame, gate: QualityGate | None, timings: dict[str, float],
                  decodable_count: int, collected: Any = None) -> tuple[DataFrame, BatchQuality | None]:
        """Run the suite on the decodable rows; every row gets `_failed_expectations`.

        The count (known from `summarize`) lets the gate pick its engine without a Spark job;
        `collected` (from `summarize_and_collect`) spares the pandas engine its collect."""
        if gate is None:
            return decoded.withColumn(FAILED, self.expressions.get("no failures", no_failures)), None
        mark = self.clock()
        decodable = decoded.filter(self.expressions.get("decodable", decodable_rows)).drop(PAYLOAD)
        quality = gate.validate(decodable, decodable_count, collected)
        timings["expectations"] = self.clock() - mark
        return mark_failures(decoded.sparkSession, decoded, quality, self.expressions), quality

    def _write(self, rows: DataFrame, table: TableConfig, batch_id: int, metadata: str,
               merge_schema: bool | None = None) -> str:
        merge = table.merge_schema if merge_schema is None else merge_schema
        writer = (
            rows.write.format("delta").mode("append")
            .option("txnAppId", self.config.name)
            .option("txnVersion", str(batch_id))
            .option("userMetadata", metadata)
            .option("mergeSchema", str(merge).lower())
        )
        if table.optimize_write:
            writer = writer.option("optimizeWrite", "true")
        if table.partition_by:
            writer = writer.partitionBy(*table.partition_by)
        if table.path is not None:
            writer.save(table.path)
        else:
            writer.saveAsTable(table.table_name)
        self.warmer.warm(rows.sparkSession, table)
        return table.location


def _in_background(action: Callable[[], str]) -> Callable[[], str]:
    """Start `action` on a thread that inherits this thread's Spark local properties (job group,
    scheduler pool); the returned call waits for it and returns its result or raises its error."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = action()
        except BaseException as exc:  # handed to the waiting thread
            outcome["error"] = exc

    thread = InheritableThread(target=run, name="delta-sink-write", daemon=True)
    thread.start()

    def wait() -> str:
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    return wait


def _announcer(config: PipelineConfig, metadata: MetadataStore,
               reader_options: Mapping[str, str]) -> CommitAnnouncer | None:
    if config.speedlayer is None:
        return None
    target = config.target
    uri = target.path if target.path is None or "://" in target.path else os.path.abspath(target.path)
    return CommitAnnouncer(config.speedlayer, uri or str(target.table), config.name, metadata,
                           feed_etcd_settings(config.speedlayer, reader_options))


def commit_metadata(pipeline: str, batch_id: int, spans: Mapping[str, OffsetSpan], *,
                    checkpoint: CheckpointState | None = None, decision: SplitDecision | None = None,
                    lost: Mapping[str, int] | None = None, counts: Mapping[str, int] | None = None,
                    reasons: Mapping[str, int] | None = None, started_ms: int | None = None) -> str:
    """The Delta commit's userMetadata: which offsets and objects this version holds, the
    checkpoint that planned it, how it was split, what was skipped (`pipelines.batch_trail`),
    how many rows went where (`counts`: rows in, to the target, to the quarantine, and
    `quarantine_by_reason`) and when the batch started (`started_ms`, Unix ms: the commit's
    own timestamp minus it is the batch's time up to that commit).

    The console's pipeline page reads all of it from the target's log tail alone; fields are
    only ever added, so a reader takes a commit without them (written by an older release) as
    "not recorded"."""
    value: dict = {
        "pipeline": pipeline,
        "batch_id": batch_id,
        "offsets": {t: {"start": s.start, "end": s.end} for t, s in sorted(spans.items())},
        "objects": sorted({src for s in spans.values() for src in s.sources}),
    }
    if checkpoint is not None:
        value["checkpoint"] = {"id": checkpoint.query_id, "location": checkpoint.location}
    if decision is not None:
        value["split"] = decision.to_json_dict()
        value["split_fingerprint"] = decision.fingerprint
    if lost:
        value["lost"] = dict(sorted(lost.items()))
    if counts is not None:
        value["counts"] = {"rows": sum(s.rows for s in spans.values()), "target": counts["valid"],
                           "quarantine": counts["decode"] + counts["expectations"]}
        if reasons is not None:
            value["counts"]["quarantine_by_reason"] = dict(sorted(reasons.items()))
    if started_ms is not None:
        value["started_ms"] = started_ms
    return json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)


def cursor_ends(spans: Mapping[str, OffsetSpan], planned: Mapping[str, PlannedRange] | None) -> dict[str, int]:
    """Where the cursors go after a batch: its planned ends (offsets skipped as lost included),
    else the end of the rows it holds."""
    ends = {t: s.end for t, s in spans.items()}
    for topic, rng in (planned or {}).items():
        ends[topic] = max(ends.get(topic, 0), rng.end)
    return ends


def target_rows(marked: DataFrame, expressions: ExpressionCache | None = None) -> DataFrame:
    """Rows that decoded and passed every expectation, without the raw payload."""
    cache = ExpressionCache.given(expressions)
    valid = marked.filter(cache.get("valid", lambda: F.col(DECODE_ERROR).isNull() & (F.size(F.col(FAILED)) == 0)))
    if "_rescued_data" not in valid.columns:  # raw format: the payload is the data
        return valid.drop(DECODE_ERROR, FAILED)
    return valid.drop(PAYLOAD, DECODE_ERROR, FAILED)


def quarantine_rows(marked: DataFrame, pipeline: str, batch_id: int,
                    expressions: ExpressionCache | None = None) -> DataFrame:
    """Failing rows with their raw payload and why they failed (a fixed schema for every format)."""
    cache = ExpressionCache.given(expressions)
    failing = marked.filter(cache.get("failing", lambda: F.col(DECODE_ERROR).isNotNull() | (F.size(F.col(FAILED)) > 0)))
    kept = cache.get(("quarantined", pipeline), lambda: [
        *[F.col(c) for c in META_COLUMNS], F.col(PAYLOAD), F.col(DECODE_ERROR), F.col(FAILED),
        F.lit(pipeline).alias("_pipeline")])
    return failing.select(*kept, F.lit(batch_id).cast("long").alias("_batch_id"),
                          cache.get("quarantined_at", lambda: F.current_timestamp().alias("_quarantined_at")))


def results_frame(spark: SparkSession, pipeline: str, batch_id: int, quality: BatchQuality) -> DataFrame:
    """One row per expectation of the batch, for the optional `expectations.results` table."""
    rows = [
        (pipeline, batch_id, quality.suite, o.name, o.success, o.element_count, o.unexpected_count,
         None if o.observed_value is None else json.dumps(o.observed_value, default=str), quality.duration_s)
        for o in quality.outcomes
    ]
    schema = ("pipeline string, batch_id long, suite string, expectation string, success boolean, "
              "element_count long, unexpected_count long, observed_value string, suite_duration_s double")
    return spark.createDataFrame(rows, schema).withColumn("validated_at", F.current_timestamp())
