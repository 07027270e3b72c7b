"""What the pipelines page shows for each pipeline file the console is given: its target table,
its last batches from the tail of the target's Delta log, the quarantine by reason for those
batches, its cursors against the topic heads, and its speed-layer announcement.

Batches come from the commits' `userMetadata` the sink writes (`pipelines.delta_sink.
commit_metadata`: pipeline, batch id, offsets, `counts` of rows in / to the target / to the
quarantine), read with delta-rs (`history(limit)`: the newest commit files only, no Spark).
Durations are not in the Delta log: they come from the pipeline's Prometheus endpoint when one
is configured and exports a batch duration, and show as "—" otherwise.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from danube_core.errors import DanubeError
from pipelines.config import PipelineConfig, load_config

logger = logging.getLogger(__name__)

REASON_COLUMNS = ("_batch_id", "_decode_error", "_failed_expectations")


@dataclass(frozen=True)
class BatchRow:
    batch_id: int
    version: int
    committed_ms: int | None
    rows_in: int | None
    rows_written: int | None
    rows_quarantined: int | None
    offsets: Mapping[str, Mapping[str, int]]


@dataclass(frozen=True)
class TableLog:
    """The tail of one Delta table's log as far as a pipeline wrote it."""

    location: str
    version: int | None = None
    batches: list[BatchRow] = field(default_factory=list)
    problem: str | None = None


@dataclass(frozen=True)
class PipelineFile:
    """One configured pipeline file, parsed (or why not)."""

    file: str
    config: PipelineConfig | None
    problem: str | None = None

    @property
    def name(self) -> str:
        return self.config.name if self.config is not None else os.path.basename(self.file)


def load_pipelines(files: tuple[str, ...], env: Mapping[str, str]) -> list[PipelineFile]:
    """Each file through the pipelines' own parser; a bad one is kept with its error."""
    out = []
    for file in files:
        try:
            out.append(PipelineFile(file, load_config(file, env={**os.environ, **env})))
        except DanubeError as exc:
            out.append(PipelineFile(file, None, str(exc)))
    return out


def table_location(config: PipelineConfig, quarantine: bool = False) -> str | None:
    """The Delta path of the target (or quarantine); None for a metastore table name."""
    table = config.quarantine if quarantine else config.target
    return table.path


def read_batches(config: PipelineConfig, limit: int, storage_options: Mapping[str, str] | None = None) -> TableLog:
    """The pipeline's last `limit` commits to its target, newest first."""
    location = table_location(config)
    if location is None:
        return TableLog(str(config.target.table), problem="a metastore table: its log is read through Spark only")
    try:
        from deltalake import DeltaTable

        table = DeltaTable(location, storage_options=dict(storage_options or {}) or None, without_files=True)
        history = table.history(limit)
        version = table.version()
    except Exception as exc:  # noqa: BLE001 (delta-rs raises its own and OSError types; all mean "cannot read")
        return TableLog(location, problem=f"Delta table {location} unreadable: {_first_line(exc)}")
    batches = [b for b in (_batch(config.name, commit) for commit in history) if b is not None]
    return TableLog(location, version, batches)


def _batch(pipeline: str, commit: Mapping[str, Any]) -> BatchRow | None:
    try:
        meta = json.loads(commit.get("userMetadata") or "null")
    except ValueError:
        return None
    if not isinstance(meta, dict) or meta.get("pipeline") != pipeline:
        return None
    counts = meta.get("counts") or {}
    return BatchRow(int(meta.get("batch_id", -1)), int(commit.get("version", -1)), commit.get("timestamp"),
                    counts.get("rows"), counts.get("target"), counts.get("quarantine"), meta.get("offsets") or {})


def quarantine_reasons(config: PipelineConfig, batch_ids: list[int],
                       storage_options: Mapping[str, str] | None = None) -> tuple[dict[str, int], str | None]:
    """Rows quarantined in `batch_ids`, by reason (the decode error, else the failed
    expectations joined), read from the quarantine table's files for those batches only."""
    location = table_location(config, quarantine=True)
    if location is None or not batch_ids:
        return {}, None
    try:
        import pyarrow.compute as pc
        from deltalake import DeltaTable

        dataset = DeltaTable(location, storage_options=dict(storage_options or {}) or None).to_pyarrow_dataset()
        rows = dataset.to_table(columns=list(REASON_COLUMNS), filter=pc.field("_batch_id").isin(batch_ids))
    except Exception as exc:  # noqa: BLE001 (see read_batches)
        return {}, f"quarantine table {location} unreadable: {_first_line(exc)}"
    reasons: dict[str, int] = {}
    for decode_error, failed in zip(rows.column("_decode_error").to_pylist(),
                                    rows.column("_failed_expectations").to_pylist()):
        reason = _short(decode_error) if decode_error else " & ".join(failed or ()) or "unknown"
        reasons[reason] = reasons.get(reason, 0) + 1
    return dict(sorted(reasons.items(), key=lambda item: -item[1])), None


def source_topics(config: PipelineConfig, namespace_topics: Mapping[str, list[str]]) -> list[str]:
    """The topics (base names) the pipeline reads: its list, or those of its namespace or pattern."""
    source = config.source
    if source.topics:
        return list(source.topics)
    names = [t for ts in namespace_topics.values() for t in ts]
    if source.namespace:
        return [t for t in names if t.startswith(f"/{source.namespace}/")]
    if source.topic_pattern:
        pattern = re.compile(source.topic_pattern)
        return [t for t in names if pattern.fullmatch(t)]
    return []


def metrics_endpoint(config: PipelineConfig, configured: Mapping[str, str]) -> str | None:
    """The console's `pipelines.metrics` entry for the pipeline, else its file's `metrics` section
    (a pipeline file without one, or a pipelines release without that section, has none)."""
    if config.name in configured:
        return configured[config.name]
    section = getattr(config, "metrics", None)
    return f"{section.host}:{section.port}" if section is not None else None


def _short(text: str, limit: int = 120) -> str:
    line = text.strip().splitlines()[0] if text.strip() else text
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _first_line(exc: BaseException) -> str:
    return _short(str(exc) or type(exc).__name__, 300)
