"""What each micro-batch of a pipeline did: rows in, valid, quarantined, lost, quality, timings, cursors.

The sink records one `BatchReport` per batch it commits; the runner, the demo, the benchmark
and the notebooks read them from `PipelineMetrics` (thread-safe: foreachBatch runs on a Spark
thread while the caller polls), and listeners hear of each as it is recorded (the Prometheus
endpoint, `pipelines.metrics_endpoint`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Callable, Mapping

from pipelines.expectations import BatchQuality

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OffsetSpan:
    """Offsets of one topic partition in a batch: `[start, end)` (end-exclusive) and the objects read."""

    start: int
    end: int
    rows: int
    sources: tuple[str, ...]


@dataclass(frozen=True)
class BatchReport:
    """One committed micro-batch.

    `lost_offsets`: per topic partition, offsets inside the batch's planned range that reached
    no table because the connector skipped them under failOnDataLoss=false (on the driver or on
    an executor). `replayed`: the batch was a replay split with its first attempt's decision.
    """

    batch_id: int
    rows: int
    valid: int
    decode_failures: int
    expectation_failures: int
    spans: Mapping[str, OffsetSpan]
    cursors: Mapping[str, int]
    quality: BatchQuality | None
    timings_s: Mapping[str, float] = field(default_factory=dict)
    lost_offsets: Mapping[str, int] = field(default_factory=dict)
    replayed: bool = False

    @property
    def lost(self) -> int:
        """Offsets of the batch's planned ranges that it did not hold (failOnDataLoss=false skips)."""
        return sum(self.lost_offsets.values())

    @property
    def quarantined(self) -> int:
        return self.decode_failures + self.expectation_failures

    @property
    def duration_s(self) -> float:
        return sum(self.timings_s.values())


class PipelineMetrics:
    """Every batch report of one run, in commit order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reports: list[BatchReport] = []
        self._listeners: list[Callable[[BatchReport], None]] = []
        self.announced = 0           # commits announced to the speed layer
        self.announce_failures = 0   # announcements that failed (logged; the master's poll finds them)

    def add_listener(self, listener: Callable[[BatchReport], None]) -> None:
        """Call `listener` with every report recorded from now on (on the sink's thread)."""
        with self._lock:
            self._listeners.append(listener)

    def record(self, report: BatchReport) -> None:
        """Keep `report` and tell the listeners. The batch is committed by now: a listener's
        failure is logged, never raised, since failing the batch would only replay it."""
        with self._lock:
            self._reports.append(report)
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(report)
            except Exception:
                logger.exception("a listener of the pipeline's batch reports failed on batch %d", report.batch_id)

    @property
    def reports(self) -> list[BatchReport]:
        with self._lock:
            return list(self._reports)

    def totals(self) -> dict[str, int]:
        """Sums over the run: batches, rows, valid, quarantined, lost (skipped) offsets."""
        reports = self.reports
        return {
            "batches": len(reports),
            "rows": sum(r.rows for r in reports),
            "valid": sum(r.valid for r in reports),
            "quarantined": sum(r.quarantined for r in reports),
            "lost": sum(r.lost for r in reports),
            "announced": self.announced,
            "announce_failures": self.announce_failures,
        }

    def lost_offsets(self) -> dict[str, int]:
        """Skipped offsets per topic partition over the run (failOnDataLoss=false)."""
        totals: dict[str, int] = {}
        for report in self.reports:
            for topic, count in report.lost_offsets.items():
                totals[topic] = totals.get(topic, 0) + count
        return totals
