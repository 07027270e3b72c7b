"""The WAL tail of one topic partition on its owner: where its WAL files begin and end, read
through the owner's advertised `wal_url` (its registration, or its state key once it died).

The topic page shows it beside the uploaded objects: the offsets past the last object are in
the WAL only until the uploader's next run. Only the newest file is scanned (its frame headers,
CRC-checked); the older ones give their first offsets from their first header.
"""

from __future__ import annotations

from dataclasses import dataclass

from fsspec.core import url_to_fs

from danube_core.errors import DanubeError
from danube_core.objectstore import normalize_url
from danube_core.topics import TopicName
from danube_core.wal_files import list_segments, scan_segment


@dataclass(frozen=True)
class WalTail:
    directory: str | None
    files: int = 0
    first_offset: int | None = None
    last_offset: int | None = None  # inclusive: the newest offset the owner has written
    problem: str | None = None


def topic_wal_dir(wal_url: str | None, topic: TopicName) -> str | None:
    return normalize_url(wal_url).rstrip("/") + "/" + topic.storage_path if wal_url else None


def read_wal_tail(wal_url: str | None, topic: TopicName) -> WalTail:
    directory = topic_wal_dir(wal_url, topic)
    if directory is None:
        return WalTail(None, problem="the owner advertises no WAL location (wal_url)")
    try:
        fs, path = url_to_fs(directory)
        segments = [s for s in list_segments(path, fs=fs) if s.first_offset is not None]
        if not segments:
            return WalTail(directory)
        newest = scan_segment(segments[-1], fs=fs).segment
    except (OSError, DanubeError, ValueError, ImportError) as exc:
        return WalTail(directory, problem=f"WAL {directory} unreadable: {exc}")
    return WalTail(directory, len(segments), segments[0].first_offset, newest.last_offset)
