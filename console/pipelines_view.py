"""What the pipelines page shows for each pipeline file the console is given: its target table,
its last batches from the tail of the target's Delta log (rows in, written, quarantined by
reason, duration), its cursors against the topic heads, and its speed-layer announcement.

Batches come from the commits' `userMetadata` the sink writes (`pipelines.delta_sink.
commit_metadata`: pipeline, batch id, offsets, `counts` of rows in / to the target / to the
quarantine and by reason, `started_ms`), read with delta-rs (`history(limit)`: the newest
commit files only, no Spark). That one log tail is all a pipeline page reads besides etcd,
unless its batches had payloads that did not decode (their errors: `console.quarantine_view`).
A batch's duration is its commit's timestamp minus its
`started_ms` (decode, validation and the writes; the cursor commit and the announcement come
after). Commits written before those fields existed show "—" for what they lack. A batch whose
rows were all quarantined has no commit in the target, so it is not listed.
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


@dataclass(frozen=True)
class BatchRow:
    """One commit of the pipeline to its target. None: not recorded by the release that wrote it."""

    batch_id: int
    version: int
    committed_ms: int | None
    rows_in: int | None
    rows_written: int | None
    rows_quarantined: int | None
    offsets: Mapping[str, Mapping[str, int]]
    quarantined_by_reason: Mapping[str, int] | None = None
    duration_ms: int | None = None


def reasons_total(batches: list[BatchRow]) -> tuple[dict[str, int], int]:
    """Rows quarantined by reason over `batches` (most first), and how many batches that
    quarantined rows do not say why (committed by a release that did not record reasons)."""
    reasons: dict[str, int] = {}
    unexplained = 0
    for batch in batches:
        if batch.quarantined_by_reason is None:
            unexplained += int(bool(batch.rows_quarantined))
            continue
        for reason, count in batch.quarantined_by_reason.items():
            reasons[reason] = reasons.get(reason, 0) + count
    return dict(sorted(reasons.items(), key=lambda item: (-item[1], item[0]))), unexplained


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


def read_batches(config: PipelineConfig, limit: int, storage_options: Mapping[str, str] | None = None) -> TableLog:
    """The pipeline's last `limit` commits to its target, newest first."""
    location = config.target.path
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
    found = meta.get("counts")
    counts: dict[str, Any] = found if isinstance(found, dict) else {}
    reasons = counts.get("quarantine_by_reason")
    committed, started = commit.get("timestamp"), meta.get("started_ms")
    duration = committed - started if isinstance(committed, int) and isinstance(started, int) else None
    return BatchRow(int(meta.get("batch_id", -1)), int(commit.get("version", -1)), committed,
                    counts.get("rows"), counts.get("target"), counts.get("quarantine"), meta.get("offsets") or {},
                    {str(k): int(v) for k, v in reasons.items()} if isinstance(reasons, dict) else None,
                    max(0, duration) if duration is not None else None)


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


def _short(text: str, limit: int = 120) -> str:
    line = text.strip().splitlines()[0] if text.strip() else text
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _first_line(exc: BaseException) -> str:
    return _short(str(exc) or type(exc).__name__, 300)
