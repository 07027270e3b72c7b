"""Brokers' storage engines in one test process: several `StorageEngine`s (one per pretend broker)
on one metadata store and one cloud, each with its own WAL root, closed at the end."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from broker.storage_engine import StorageEngine, StorageSettings
from broker.wal import WalConfig
from danube_core.metadata import MetadataStore

NEVER_MS = 3_600_000  # an fsync interval no test waits for: flushes happen when a test asks
ROOT = "/danube-data"


@contextmanager
def storage_engines(tmp_path: Path, metadata: MetadataStore, cloud_url: str, cloud_options: dict | None = None,
                    *, durable: bool) -> Iterator[Callable[[str, int], StorageEngine]]:
    """`make(name, broker_id)` builds an engine whose WAL is under `tmp_path/name` (uploads only
    when a test drains); every engine made is closed on exit."""
    engines: list[StorageEngine] = []

    def make(name: str, broker_id: int) -> StorageEngine:
        wal = WalConfig(root=str(tmp_path / name / "wal"), fsync_interval_ms=NEVER_MS, durable=durable)
        settings = StorageSettings(wal=wal, cloud_url=cloud_url, cloud_options=cloud_options or {},
                                   root_prefix=ROOT, uploader_interval_s=3600)
        engine = StorageEngine(settings, metadata, broker_id)
        engines.append(engine)
        return engine

    try:
        yield make
    finally:
        for engine in engines:
            engine.close()
