"""What a pipeline's Delta tables remember of it: the checkpoint it ran under and each batch's split.

Every commit the sink makes carries, in its `userMetadata` (`DESCRIBE HISTORY` shows it):

* `pipeline` and `batch_id`, equal to the commit's `txnAppId` and `txnVersion`;
* `checkpoint`: the id and location of the Spark checkpoint that planned the batch (the id is
  Spark's `<checkpoint>/metadata` id, so a deleted or replaced checkpoint has another one);
* `split`: what decided which rows went to the target and which to quarantine
  (`SplitDecision`: the decode settings, the registry schema id and the version used for
  messages that name none, the expectation suite's rules) and its fingerprint;
* `counts` (rows in, to the target, to the quarantine, `quarantine_by_reason`) and
  `started_ms`, for people and the console (`pipelines.delta_sink.commit_metadata`); nothing
  here reads them.

Two things follow from it.

**A checkpoint that does not match its tables stops the pipeline.** Delta skips a write whose
`txnVersion` is at or below the last one it recorded for the `txnAppId`, and batch ids restart
at 0 with a new checkpoint: a new checkpoint would have its batches silently skipped while the
cursors move on. So before a batch is written, `check_checkpoint` compares the checkpoint with
each table's last commit of the pipeline and raises `CheckpointMismatchError` when the table
holds batches the checkpoint does not know, or batches written under another checkpoint id. The
error names the table, the app id, both checkpoints and what to do. (This is the situation
Delta's documentation on idempotent writes in `foreachBatch` warns about.) Tables written
before checkpoint ids were recorded get only the batch-id check.

**A replayed batch is split as its first attempt was.** If a table's last commit has the batch
id being written, the batch is a replay of one that reached at least that table, and the
recorded `SplitDecision` is used instead of the current suite, decode settings and latest
schema version, so every offset lands in exactly one table however they changed in between.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from pyspark.sql import SparkSession

from danube_core.errors import CheckpointMismatchError
from pipelines.checkpoint_state import CheckpointState
from pipelines.config import DecodeConfig, ExpectationRule, ExpectationsConfig, PipelineConfig, TableConfig

logger = logging.getLogger(__name__)

HISTORY_PAGE = 100  # commits read first; the whole history only if the pipeline's last is older


@dataclass(frozen=True)
class SplitDecision:
    """Everything that decides a batch's target/quarantine split, besides the rows themselves.

    Registry versions never change once registered, so the version numbers pin the schemas.
    """

    decode: DecodeConfig
    schema_id: int | None = None
    default_version: int | None = None
    suite: str | None = None
    rules: tuple[ExpectationRule, ...] = ()

    def to_json_dict(self) -> dict:
        return {
            "decode": dataclasses.asdict(self.decode),
            "schema_id": self.schema_id,
            "default_version": self.default_version,
            "suite": self.suite,
            "rules": [{"type": r.type, "kwargs": dict(r.kwargs)} for r in self.rules],
        }

    @classmethod
    def from_json_dict(cls, value: Mapping[str, Any]) -> "SplitDecision":
        rules = tuple(ExpectationRule(r["type"], dict(r.get("kwargs") or {})) for r in value.get("rules") or ())
        return cls(DecodeConfig(**value["decode"]), value.get("schema_id"), value.get("default_version"),
                   value.get("suite"), rules)

    @property
    def fingerprint(self) -> str:
        text = json.dumps(self.to_json_dict(), sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def expectations(self) -> ExpectationsConfig | None:
        """The suite to validate with (no results table: that stays the current config's)."""
        return ExpectationsConfig(self.suite, self.rules) if self.suite is not None and self.rules else None


@dataclass(frozen=True)
class TableTrail:
    """A table's last commit of the pipeline: batch id, checkpoint tie, split and offsets."""

    location: str
    last_batch: int
    checkpoint_id: str | None
    checkpoint_location: str | None
    decision: SplitDecision | None
    offsets: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


def pipeline_tables(config: PipelineConfig) -> list[TableConfig]:
    """Every table a pipeline writes with its txnAppId: target, quarantine, results if any."""
    results = config.expectations.results if config.expectations is not None else None
    return [config.target, config.quarantine] + ([results] if results is not None else [])


def commit_trail(location: str, user_metadata: str | None, pipeline: str) -> TableTrail | None:
    """The trail one commit's userMetadata leaves, if the pipeline wrote it."""
    try:
        meta = json.loads(user_metadata) if user_metadata else None
    except ValueError:
        return None
    if not isinstance(meta, dict) or meta.get("pipeline") != pipeline or not isinstance(meta.get("batch_id"), int):
        return None
    checkpoint = meta.get("checkpoint") or {}
    split = meta.get("split")
    return TableTrail(location, meta["batch_id"], checkpoint.get("id"), checkpoint.get("location"),
                      SplitDecision.from_json_dict(split) if split else None, meta.get("offsets") or {})


def latest_trail(location: str, commits: Iterable[tuple[int, str | None]], pipeline: str) -> TableTrail | None:
    """The trail of the newest commit (highest version) the pipeline made, among `commits`."""
    for _, user_metadata in sorted(commits, key=lambda c: c[0], reverse=True):
        trail = commit_trail(location, user_metadata, pipeline)
        if trail is not None:
            return trail
    return None


def read_trail(spark: SparkSession, table: TableConfig, pipeline: str) -> TableTrail | None:
    """What `table`'s history says about `pipeline` (None: no table yet, or no commit of it)."""
    from delta.tables import DeltaTable

    if table.path is not None:
        if not DeltaTable.isDeltaTable(spark, table.path):
            return None
        delta = DeltaTable.forPath(spark, table.path)
    else:
        if not spark.catalog.tableExists(table.table_name):
            return None
        delta = DeltaTable.forName(spark, table.table_name)
    for limit in (HISTORY_PAGE, None):
        history = delta.history(limit) if limit is not None else delta.history()
        commits = [(r["version"], r["userMetadata"]) for r in history.select("version", "userMetadata").collect()]
        trail = latest_trail(table.location, commits, pipeline)
        if trail is not None or limit is None or len(commits) < limit:
            return trail
    return None


def check_checkpoint(pipeline: str, checkpoint: CheckpointState, trails: Iterable[TableTrail],
                     batch_id: int | None = None) -> None:
    """Raise `CheckpointMismatchError` if a table holds batches of `pipeline` this checkpoint
    does not know. `batch_id`: the batch about to be written (default: the checkpoint's last)."""
    trails = list(trails)
    known = batch_id if batch_id is not None else (checkpoint.last_batch if checkpoint.last_batch is not None else -1)
    for trail in trails:
        if trail.last_batch > known:
            problem = (f"holds batches up to {trail.last_batch}, but {checkpoint.describe()}"
                       + ("" if batch_id is None else f" and is about to write batch {batch_id}"))
        elif trail.checkpoint_id is not None and trail.checkpoint_id != checkpoint.query_id:
            problem = (f"was last written (batch {trail.last_batch}) under checkpoint id {trail.checkpoint_id}, "
                       f"but {checkpoint.describe()}")
        else:
            continue
        raise CheckpointMismatchError(_message(pipeline, checkpoint, trail, problem, trails))


def _message(pipeline: str, checkpoint: CheckpointState, trail: TableTrail, problem: str,
             trails: list[TableTrail]) -> str:
    where = f" at {trail.checkpoint_location}" if trail.checkpoint_location else ""
    return (
        f"pipeline {pipeline}: Delta table {trail.location} (txnAppId {pipeline!r}) {problem}. "
        f"Delta would skip this checkpoint's batches up to {trail.last_batch} as already written while the "
        f"cursors move on, so rows would be lost (or repeated). Nothing was written. Either restore the "
        f"checkpoint the table was written with{where} (id {trail.checkpoint_id or 'unknown'}) at "
        f"{checkpoint.location}, or, to start over into the same tables on purpose, give the pipeline a new "
        f"name (the name is the txnAppId) and set source.starting_offsets to where the tables end: "
        f"{json.dumps(resume_positions(trails), sort_keys=True)}."
    )


def resume_positions(trails: Iterable[TableTrail]) -> dict[str, int]:
    """The end-exclusive offset per topic after the newest batch the tables hold."""
    newest = max((t.last_batch for t in trails), default=None)
    ends: dict[str, int] = {}
    for trail in trails:
        if trail.last_batch != newest:
            continue
        for topic, span in trail.offsets.items():
            ends[topic] = max(ends.get(topic, 0), int(span.get("end", 0)))
    return ends
