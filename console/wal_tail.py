"""The WAL tail of one topic partition on its owner: where its WAL files begin and end, read
through the owner's advertised `wal_url` (its registration, or its state key once it died).

The offsets past the last uploaded object are in the WAL only until the uploader's next run,
so a partition's head, and every lag the console shows, counts them. Only the newest file is
scanned (its frame headers, CRC-checked); the older ones give their first offsets from their
first header. The lag sampler reads every partition's tail each interval, so a newest file
whose size has not changed since its last scan is not scanned again (`WalTailReader`).
"""

from __future__ import annotations

import threading
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


class WalTailReader:
    """Reads WAL tails, remembering the last offset of each newest file by (path, size): a WAL
    is only appended to, so an unchanged size means unchanged frames. Shared by the pages and
    the lag sampler's thread."""

    def __init__(self, limit: int = 100_000) -> None:
        self._scanned: dict[str, tuple[int, int | None]] = {}
        self._limit = limit
        self._lock = threading.Lock()

    def read(self, wal_url: str | None, topic: TopicName) -> WalTail:
        directory = topic_wal_dir(wal_url, topic)
        if directory is None:
            return WalTail(None, problem="the owner advertises no WAL location (wal_url)")
        try:
            fs, path = url_to_fs(directory)
            segments = [s for s in list_segments(path, fs=fs) if s.first_offset is not None]
            if not segments:
                return WalTail(directory)
            newest = segments[-1]
            size = fs.size(newest.path)
            with self._lock:
                held = self._scanned.get(newest.path)
            if held is not None and held[0] == size:
                last = held[1]
            else:
                last = scan_segment(newest, fs=fs).segment.last_offset
                with self._lock:
                    if len(self._scanned) >= self._limit:
                        self._scanned.clear()
                    self._scanned[newest.path] = (size, last)
        except (OSError, DanubeError, ValueError, ImportError) as exc:
            return WalTail(directory, problem=f"WAL {directory} unreadable: {exc}")
        return WalTail(directory, len(segments), segments[0].first_offset, last)
