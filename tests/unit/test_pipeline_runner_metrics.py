"""`PipelineRunner` owns the pipeline's Prometheus endpoint, so the demo, the notebooks and the
tests serve it as `python -m pipelines run` does: bound before the Spark session is asked for
(a port in use fails naming `metrics.port`, no session started), following the run's metrics,
closed by `stop()` or when the rest of the construction fails. No Spark: the services check is
skipped, etcd is in memory and the session is a stand-in the runner only holds."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from connectors import options as opt
from danube_core.errors import ConfigError
from danube_core.metadata_memory import MemoryMetadataStore
from danube_core.ports import free_port
from pipelines import runner as runner_module
from pipelines.config import parse_config
from pipelines.runner import PipelineRunner
from tests.unit.test_pipeline_config import with_changes
from tests.unit.test_pipeline_metrics_endpoint import report

pytestmark = pytest.mark.unit


class HeldSession:
    """The session stand-in: the runner reads its Spark version (which trigger limits it can
    honour) and holds it."""

    version = "4.2.0"


@pytest.fixture
def no_services(monkeypatch):
    """No etcd, storage or Spark: the checks pass, etcd is in memory, a session is refused."""
    monkeypatch.setattr(runner_module, "check_services", lambda config, options: None)
    monkeypatch.setattr(opt.EtcdSettings, "connect", lambda self: MemoryMetadataStore())

    def no_session(config):
        raise AssertionError("the runner asked for a Spark session")

    monkeypatch.setattr(runner_module, "_session", no_session)


def metrics_config(port: int):
    return parse_config(with_changes(None, metrics={"port": port}), "pipe.yaml", env={})


def scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return True
    return False


def test_a_runner_serves_its_metrics_until_stopped(no_services):
    port = free_port()
    runner = PipelineRunner(metrics_config(port), spark=HeldSession())  # type: ignore[arg-type]
    try:
        runner.metrics.record(report(0, rows=10, valid=7, decode=3, expectations=0))
        text = scrape(port)
        assert 'danube_pipeline_rows_in_total{pipeline="orders"} 10.0' in text
        assert 'danube_pipeline_rows_quarantined_total{pipeline="orders",reason="decode"} 3.0' in text
    finally:
        runner.stop()
    assert refused(port)


def test_a_port_in_use_fails_before_spark_naming_the_key(no_services):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"pipe.yaml: metrics: cannot listen on 127.0.0.1:{port}: .*metrics.port"):
            PipelineRunner(metrics_config(port))  # no spark given: `no_session` would fail the test first


def test_the_endpoint_is_closed_when_the_runner_cannot_be_built(no_services):
    port = free_port()
    with pytest.raises(AssertionError, match="asked for a Spark session"):
        PipelineRunner(metrics_config(port))
    assert refused(port)


def test_without_a_metrics_section_nothing_listens(no_services):
    runner = PipelineRunner(parse_config(with_changes(None), "pipe.yaml", env={}), spark=HeldSession())  # type: ignore[arg-type]
    try:
        assert runner.endpoint is None
    finally:
        runner.stop()
