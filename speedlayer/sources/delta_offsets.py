"""The topic offsets a Delta table version holds, from its commits' `userMetadata`.

A pipeline's every commit names, in its `userMetadata`, the offset ranges per topic partition
the batch it wrote holds (`{"offsets": {"/ns/t-part-0": {"start": s, "end": e}}, ...}`, end
exclusive; `pipelines.delta_sink.commit_metadata`). The batches of one pipeline follow each
other without gaps, so version V holds, per partition, everything below the greatest `end` of
the commits up to V. That end is where a dataset's tail takes over (`speedlayer.tail_spec`).

Reading a table's whole history for every new version would grow with the table's age, so the
highest version worked out is kept per table and a newer one reads only the commits after it.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from speedlayer.errors import SourceError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TableOffsets:
    """What a table version's commits say: the offsets it holds per topic partition (end
    exclusive) and the pipelines (`userMetadata.pipeline`) that wrote them."""

    offsets: Mapping[str, int] = field(default_factory=dict)
    pipelines: frozenset[str] = frozenset()


def fold_commits(commits: Iterable[tuple[int, str | None]], start: TableOffsets | None = None) -> TableOffsets:
    """Per topic partition, the greatest end-exclusive offset `start` and the commits name.

    `commits`: (version, userMetadata) in any order; a commit whose userMetadata is not a
    pipeline's (not JSON, or without `offsets`) adds nothing."""
    ends = dict(start.offsets) if start is not None else {}
    names = set(start.pipelines) if start is not None else set()
    for _, text in commits:
        if not text:
            continue
        try:
            meta = json.loads(text)
        except ValueError:
            continue
        offsets = meta.get("offsets") if isinstance(meta, dict) else None
        if not isinstance(offsets, dict):
            continue
        if isinstance(meta.get("pipeline"), str):
            names.add(meta["pipeline"])
        for topic, span in offsets.items():
            end = span.get("end") if isinstance(span, dict) else None
            if isinstance(end, int) and end > ends.get(topic, -1):
                ends[topic] = end
    return TableOffsets(dict(sorted(ends.items())), frozenset(names))


class DeltaOffsets:
    """`at(table_uri, version)`: what that version's commits say (no offsets: no commit up to
    it names any, i.e. the table was not written by a pipeline). Thread-safe.

    The commit files (`_delta_log/<version>.json`) are read directly, through fsspec: delta-rs's
    `history()` on a table opened at an older version labels the newest commits with that
    version's numbers (deltalake 1.6), which would put the boundary in the wrong place. A log
    whose first commits were cleaned up (`delta.logRetentionDuration`) cannot say which
    partitions they held: it is refused rather than answered with a boundary too low."""

    def __init__(self, storage_options: dict[str, str] | None = None) -> None:
        self._storage_options = fsspec_options(storage_options or {})
        self._lock = threading.Lock()
        self._known: dict[str, tuple[int, TableOffsets]] = {}  # table -> (version, what it holds)

    def at(self, table_uri: str, version: int) -> TableOffsets:
        with self._lock:
            known = self._known.get(table_uri)
        if known is not None and known[0] == version:
            return known[1]
        after, start = (known[0], known[1]) if known is not None and known[0] < version else (-1, None)
        offsets = fold_commits(self._commits(table_uri, after, version), start)
        with self._lock:
            if table_uri not in self._known or self._known[table_uri][0] < version:
                self._known[table_uri] = (version, offsets)
        return offsets

    def _commits(self, table_uri: str, after: int, version: int) -> list[tuple[int, str | None]]:
        """(version, userMetadata) of the commits in (after, version]."""
        import fsspec

        log = table_uri.rstrip("/") + "/_delta_log"
        try:
            fs, root = fsspec.core.url_to_fs(log, **self._storage_options)
            found = {}
            for path in fs.ls(root, detail=False):
                name = path.rsplit("/", 1)[-1]
                if name.endswith(".json") and name[:-5].isdigit() and after < int(name[:-5]) <= version:
                    found[int(name[:-5])] = path
            missing = [v for v in range(after + 1, version + 1) if v not in found]
            if missing:
                raise SourceError(f"{table_uri}: the Delta log has no commit file for version(s) {missing[:5]}"
                                  f"{' ...' if len(missing) > 5 else ''} (cleaned up?): the topic offsets the "
                                  f"version holds cannot be told, so it has no tail")
            return [(v, _user_metadata(fs.cat_file(found[v]))) for v in sorted(found)]
        except SourceError:
            raise
        except Exception as exc:  # fsspec backends raise OSError and their own errors alike
            raise SourceError(f"reading the Delta log of {table_uri} up to version {version} failed: {exc}") from exc


def _user_metadata(commit: bytes) -> str | None:
    """The commitInfo's userMetadata of one commit file (newline-delimited JSON actions)."""
    for line in commit.splitlines():
        if b"commitInfo" in line:
            info = json.loads(line).get("commitInfo")
            if isinstance(info, dict):
                value = info.get("userMetadata")
                return value if isinstance(value, str) else None
    return None


_AWS_KEYS = {"AWS_ACCESS_KEY_ID": "key", "AWS_SECRET_ACCESS_KEY": "secret", "AWS_SESSION_TOKEN": "token"}


def fsspec_options(delta_options: Mapping[str, str]) -> dict:
    """delta-rs storage options (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`, ...) as s3fs's."""
    options: dict = {}
    client: dict = {}
    for key, value in delta_options.items():
        upper = key.upper()
        if upper in _AWS_KEYS:
            options[_AWS_KEYS[upper]] = value
        elif upper in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT"):
            client["endpoint_url"] = value
        elif upper in ("AWS_REGION", "AWS_DEFAULT_REGION"):
            client["region_name"] = value
    if client:
        options["client_kwargs"] = client
    return options
