"""A pipeline's Delta tables read for the checker, without Spark: the rows live at the end
(message id, topic partition, offset), each target version's answer to the readers' query,
and each batch's offsets from the commits' `userMetadata`.

Files are read once each with pyarrow; versions are replayed from the JSON log (adds and
removes), so a version's answer is what a reader of exactly that version gets.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

from devstack.chaos.recorder import batch_offsets
from devstack.faults.kit import payload_id


@dataclass(frozen=True)
class Row:
    key: int
    topic: str | None
    offset: int | None


@dataclass
class TableRead:
    """One table: live rows, per-version (row count, sum of n), batches and reported losses."""

    rows: list[Row] = field(default_factory=list)
    answers: dict[int, tuple[int, int]] = field(default_factory=dict)
    batches: dict[int, dict[str, tuple[int, int]]] = field(default_factory=dict)
    lost_reported: dict[str, int] = field(default_factory=dict)
    versions: int = 0


def read_table(table: Path) -> TableRead:
    """Replay `table`'s log; an absent table reads as empty."""
    result = TableRead()
    log = Path(table) / "_delta_log"
    if not log.is_dir():
        return result
    files: dict[str, list[Row]] = {}
    live: set[str] = set()
    count = total = 0
    for path in sorted(log.glob("*.json"), key=lambda p: int(p.stem)):
        for line in path.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                name = action["add"]["path"]
                if name not in files:
                    files[name] = _file_rows(Path(table) / unquote(name))
                if name not in live:
                    live.add(name)
                    count += len(files[name])
                    total += sum(r.key for r in files[name])
            elif "remove" in action and action["remove"]["path"] in live:
                name = action["remove"]["path"]
                live.discard(name)
                count -= len(files[name])
                total -= sum(r.key for r in files[name])
            elif "commitInfo" in action:
                _batch(result, action["commitInfo"].get("userMetadata"))
        result.answers[int(path.stem)] = (count, total)
        result.versions += 1
    result.rows = [row for name in sorted(live) for row in files[name]]
    return result


def _batch(result: TableRead, user_metadata: str | None) -> None:
    if not user_metadata:
        return
    try:
        value = json.loads(user_metadata)
    except ValueError:
        return
    if not isinstance(value, dict) or "batch_id" not in value:
        return
    result.batches[int(value["batch_id"])] = batch_offsets(user_metadata)
    for topic, lost in (value.get("lost") or {}).items():
        result.lost_reported[topic] = result.lost_reported.get(topic, 0) + int(lost)


def _file_rows(path: Path) -> list[Row]:
    import pyarrow.parquet as pq

    names = pq.read_schema(path).names
    key_column = "n" if "n" in names and "payload" not in names else "payload"
    columns = [c for c in (key_column, "_topic", "_offset") if c in names]
    data = pq.read_table(path, columns=columns).to_pydict()
    keys = data[key_column]
    topics = data.get("_topic", [None] * len(keys))
    offsets = data.get("_offset", [None] * len(keys))
    return [Row(k if key_column == "n" else payload_id(k), t, o) for k, t, o in zip(keys, topics, offsets)]
