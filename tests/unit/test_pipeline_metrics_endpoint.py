"""A pipeline's Prometheus endpoint without Spark: the `metrics:` section (off by default, a bad
value names its key), each committed batch counted with bounded labels, served over HTTP, and a
listener's failure never failing the batch it was told about."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from danube_core.errors import ConfigError
from danube_core.ports import free_port
from pipelines.config import MetricsConfig, parse_config
from pipelines.metrics import BatchReport, OffsetSpan, PipelineMetrics
from pipelines.metrics_endpoint import MetricsEndpoint, PipelinePrometheus
from tests.unit.test_pipeline_config import MINIMAL, with_changes

pytestmark = pytest.mark.unit


def report(batch_id: int, rows: int, valid: int, decode: int, expectations: int, **extra) -> BatchReport:
    spans = {"/default/orders-part-0": OffsetSpan(0, rows, rows, ())}
    return BatchReport(batch_id, rows, valid, decode, expectations, spans, {"/default/orders-part-0": rows - 1},
                       None, timings_s={"decode": 0.2, "write": 1.1, "cursor": 0.05}, **extra)


def config_error(data: dict) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "pipe.yaml", env={})
    return str(info.value)


def test_the_metrics_section_is_off_by_default_and_checked():
    assert parse_config(MINIMAL, env={}).metrics is None
    assert parse_config(with_changes(None, metrics={"port": 9464}), env={}).metrics == MetricsConfig(9464, "127.0.0.1")
    from_env = parse_config(with_changes(None, metrics={"port": "${PORT}", "host": "0.0.0.0"}), env={"PORT": "9500"})
    assert from_env.metrics == MetricsConfig(9500, "0.0.0.0")

    assert "pipe.yaml: metrics.port: expected an integer, got '9464' (str)" in config_error(
        with_changes(None, metrics={"port": "9464"}))
    assert "pipe.yaml: metrics.port: expected a TCP port 1-65535, got 70000" in config_error(
        with_changes(None, metrics={"port": 70000}))
    assert "pipe.yaml: metrics.port: missing required key" in config_error(with_changes(None, metrics={}))
    assert "metrics.path: unknown key; accepted keys here: port, host" in config_error(
        with_changes(None, metrics={"port": 9464, "path": "/m"}))


def test_each_committed_batch_is_counted_with_bounded_labels():
    now = [1000.0]
    exporter = PipelinePrometheus("orders", "orders-sub", clock=lambda: now[0])
    value = exporter.registry.get_sample_value
    pipeline = {"pipeline": "orders"}
    assert value("danube_pipeline_last_commit_timestamp_seconds", {**pipeline, "subscription": "orders-sub"}) == 1000.0
    assert value("danube_pipeline_rows_quarantined_total", {**pipeline, "reason": "decode"}) == 0.0

    now[0] = 1060.0
    exporter.observe(report(0, rows=100, valid=90, decode=4, expectations=6, lost_offsets={"/default/orders-part-0": 2}))
    exporter.observe(report(1, rows=50, valid=50, decode=0, expectations=0))

    assert value("danube_pipeline_batches_total", pipeline) == 2.0
    assert value("danube_pipeline_rows_in_total", pipeline) == 150.0
    assert value("danube_pipeline_rows_written_total", pipeline) == 140.0
    assert value("danube_pipeline_rows_quarantined_total", {**pipeline, "reason": "decode"}) == 4.0
    assert value("danube_pipeline_rows_quarantined_total", {**pipeline, "reason": "expectations"}) == 6.0
    assert value("danube_pipeline_offsets_lost_total", pipeline) == 2.0
    assert value("danube_pipeline_batch_duration_seconds_count", pipeline) == 2.0
    assert value("danube_pipeline_batch_duration_seconds_sum", pipeline) == pytest.approx(2 * 1.35)
    assert value("danube_pipeline_batch_duration_seconds_bucket", {**pipeline, "le": "1.0"}) == 0.0
    assert value("danube_pipeline_batch_duration_seconds_bucket", {**pipeline, "le": "2.5"}) == 2.0
    assert value("danube_pipeline_batch_phase_seconds_count", {**pipeline, "phase": "write"}) == 2.0
    assert value("danube_pipeline_last_commit_timestamp_seconds", {**pipeline, "subscription": "orders-sub"}) == 1060.0

    labels = {name for family in exporter.registry.collect() for sample in family.samples for name in sample.labels}
    assert labels <= {"pipeline", "subscription", "reason", "phase", "le"}  # no offsets, batch ids or partitions


def test_the_endpoint_serves_what_the_run_records_and_names_a_taken_port():
    config = parse_config(with_changes(None, metrics={"port": free_port()}), "pipe.yaml", env={})
    metrics = PipelineMetrics()
    endpoint = MetricsEndpoint(config)
    try:
        endpoint.follow(metrics)
        metrics.record(report(7, rows=10, valid=8, decode=2, expectations=0))
        text = urllib.request.urlopen(f"http://127.0.0.1:{config.metrics.port}/metrics", timeout=10).read().decode()
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for family in text_string_to_metric_families(text) for s in family.samples}
        assert samples[("danube_pipeline_rows_in_total", (("pipeline", "orders"),))] == 10.0
        assert samples[("danube_pipeline_rows_quarantined_total", (("pipeline", "orders"), ("reason", "decode")))] == 2.0

        with pytest.raises(ConfigError, match=r"pipe.yaml: metrics: cannot listen on 127.0.0.1:\d+: .*metrics.port"):
            MetricsEndpoint(config)  # the port is this endpoint's
    finally:
        endpoint.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", config.metrics.port), timeout=2).close()


def test_a_failing_listener_does_not_fail_the_committed_batch(caplog):
    metrics = PipelineMetrics()
    heard: list[int] = []
    metrics.add_listener(lambda r: 1 / 0)
    metrics.add_listener(lambda r: heard.append(r.batch_id))
    metrics.record(report(3, rows=1, valid=1, decode=0, expectations=0))
    assert heard == [3] and metrics.totals()["batches"] == 1
    assert "failed on batch 3" in caplog.text


def test_announcements_to_the_speed_layer_are_exported_as_counters():
    exporter = PipelinePrometheus("orders", "orders-sub")
    value = exporter.registry.get_sample_value
    pipeline = {"pipeline": "orders"}
    assert value("danube_pipeline_announced_total", pipeline) == 0.0  # before a run is followed
    assert value("danube_pipeline_announce_failures_total", pipeline) == 0.0

    metrics = PipelineMetrics()
    exporter.follow(metrics)
    metrics.announced += 3  # as the sink counts them, outside the batch report
    metrics.announce_failures += 1
    metrics.record(report(0, rows=5, valid=5, decode=0, expectations=0))
    assert value("danube_pipeline_announced_total", pipeline) == 3.0
    assert value("danube_pipeline_announce_failures_total", pipeline) == 1.0
    assert value("danube_pipeline_batches_total", pipeline) == 1.0
    families = {f.name: f.type for f in exporter.registry.collect()}
    assert families["danube_pipeline_announced"] == families["danube_pipeline_announce_failures"] == "counter"
