"""A pipeline's Prometheus endpoint (the pipeline file's `metrics:` section; off by default).

Each committed batch's `BatchReport` becomes counters, histograms and gauges, which
`deploy/grafana/pipelines.json` draws and `deploy/prometheus/alerts.yml` watches ("pipeline
stopped committing", "quarantine rate"). How far the subscription is behind is the broker's to
say (`danube_subscription_lag_*`, `broker.metrics`): it keeps counting while a pipeline is
down, when this endpoint is gone too.

Labels are bounded: `pipeline` and `subscription` from the file, `reason` (decode,
expectations) and `phase` (the sink's timing names: decode, expectations, write, cursor,
announce); never a batch id, an offset or a topic partition.

The speed-layer announcements (`danube_pipeline_announced_total`,
`danube_pipeline_announce_failures_total`) are read from the followed `PipelineMetrics` at each
scrape: the sink counts them there, outside the batch report, and a failed announcement is
harmless to the batch (the master's poll finds the commit), so only a rising failure count says
the speed layer hears of commits late.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from danube_core.errors import ConfigError
from pipelines.config import PipelineConfig
from pipelines.metrics import BatchReport, PipelineMetrics

logger = logging.getLogger(__name__)

# Quarantine reasons: rows whose payload did not decode, rows that failed an expectation.
DECODE, EXPECTATIONS = "decode", "expectations"
BATCH_SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class PipelinePrometheus:
    """One pipeline's instruments, in a registry of their own: a process may run several
    pipelines (the tests do), and the default registry takes each metric name once."""

    def __init__(self, pipeline: str, subscription: str, *, clock: Callable[[], float] = time.time) -> None:
        self.registry = registry = CollectorRegistry()
        self._clock = clock
        one = ["pipeline"]
        self._batches = Counter("danube_pipeline_batches", "Micro-batches committed", one,
                                registry=registry).labels(pipeline)
        self._rows_in = Counter("danube_pipeline_rows_in", "Rows read from the topics, per committed batch", one,
                                registry=registry).labels(pipeline)
        self._rows_written = Counter("danube_pipeline_rows_written", "Rows appended to the target table", one,
                                     registry=registry).labels(pipeline)
        quarantined = Counter("danube_pipeline_rows_quarantined", "Rows appended to the quarantine table, by reason",
                              ["pipeline", "reason"], registry=registry)
        self._quarantined = {reason: quarantined.labels(pipeline, reason) for reason in (DECODE, EXPECTATIONS)}
        self._lost = Counter("danube_pipeline_offsets_lost", "Offsets of planned ranges skipped as lost "
                             "(failOnDataLoss=false)", one, registry=registry).labels(pipeline)
        self._duration = Histogram("danube_pipeline_batch_duration_seconds", "Time the sink spent on a batch", one,
                                   buckets=BATCH_SECONDS_BUCKETS, registry=registry).labels(pipeline)
        self._phases = Histogram("danube_pipeline_batch_phase_seconds", "Time of each step of a batch",
                                 ["pipeline", "phase"], buckets=BATCH_SECONDS_BUCKETS, registry=registry)
        self._pipeline = pipeline
        # `subscription` lets an alert join this with the broker's lag of the same subscription.
        self._last_commit = Gauge(
            "danube_pipeline_last_commit_timestamp_seconds",
            "Unix time of the last committed batch (the endpoint's start time until the first)",
            ["pipeline", "subscription"], registry=registry).labels(pipeline, subscription)
        self._last_commit.set(clock())
        self._announcements = AnnouncementCollector(pipeline)
        registry.register(self._announcements)

    def follow(self, metrics: PipelineMetrics) -> None:
        """Count every batch `metrics` records from now on, and export its announcement counts."""
        self._announcements.metrics = metrics
        metrics.add_listener(self.observe)

    def observe(self, report: BatchReport) -> None:
        """Count one committed batch (a `PipelineMetrics` listener)."""
        self._batches.inc()
        self._rows_in.inc(report.rows)
        self._rows_written.inc(report.valid)
        self._quarantined[DECODE].inc(report.decode_failures)
        self._quarantined[EXPECTATIONS].inc(report.expectation_failures)
        self._lost.inc(report.lost)
        self._duration.observe(report.duration_s)
        for phase, seconds in report.timings_s.items():
            self._phases.labels(self._pipeline, phase).observe(seconds)
        self._last_commit.set(self._clock())


class MetricsEndpoint:
    """The HTTP server of a pipeline's metrics, bound before Spark starts (a port in use fails
    in a second, naming the key); `follow` the run's `PipelineMetrics`; `close()` stops it."""

    def __init__(self, config: PipelineConfig) -> None:
        if config.metrics is None:
            raise ValueError(f"pipeline {config.name} has no metrics section")
        self.exporter = PipelinePrometheus(config.name, config.source.subscription)
        host, port = config.metrics.host, config.metrics.port
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=self.exporter.registry)
        except OSError as exc:
            raise ConfigError(f"{config.file}: metrics: cannot listen on {host}:{port}: "
                              f"{exc.strerror or exc} (port in use? set metrics.port)") from exc
        logger.info("pipeline %s: Prometheus metrics on http://%s:%d/metrics", config.name, host, port)

    def follow(self, metrics: PipelineMetrics) -> None:
        """Count every batch `metrics` records from now on (and its announcements)."""
        self.exporter.follow(metrics)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5.0)


class AnnouncementCollector(Collector):
    """The followed run's announcement counts, as counters (0 until a run is followed or for a
    pipeline without a `speedlayer:` feed): `PipelineMetrics.announced` and
    `announce_failures` are plain integers the sink increments, read here at each scrape."""

    def __init__(self, pipeline: str) -> None:
        self.pipeline = pipeline
        self.metrics: PipelineMetrics | None = None

    def collect(self) -> Iterator[CounterMetricFamily]:
        followed = self.metrics
        announced = CounterMetricFamily("danube_pipeline_announced", "Target commits announced to the speed layer",
                                        labels=["pipeline"])
        announced.add_metric([self.pipeline], followed.announced if followed is not None else 0)
        failed = CounterMetricFamily("danube_pipeline_announce_failures", "Announcements to the speed layer that "
                                     "failed (the master's poll finds those commits later)", labels=["pipeline"])
        failed.add_metric([self.pipeline], followed.announce_failures if followed is not None else 0)
        yield announced
        yield failed
