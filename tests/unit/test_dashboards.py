"""The Grafana dashboards of `deploy/grafana/` import as they are (valid JSON, unique panel ids, a
Prometheus datasource variable every panel uses), and every metric they or the alert rules of
`deploy/prometheus/alerts.yml` read is one a component registers: the names come from the
components' own prometheus-client registries and collectors, the queries from a PromQL parser."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import promql_parser
import pytest
import yaml
from prometheus_client import REGISTRY, CollectorRegistry

from broker.metrics import BrokerCollector, broker_registry
from pipelines.metrics_endpoint import PipelinePrometheus

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((REPO / "deploy" / "grafana").glob("*.json"))
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
# The sample names a family of each type is exposed as (Prometheus' text format).
SAMPLE_SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "untyped": ("",), "unknown": ("",),
                   "histogram": ("_bucket", "_count", "_sum", "_created"), "summary": ("", "_count", "_sum", "_created"),
                   "info": ("_info",)}
# Grafana's interval variables stand where PromQL takes a duration.
GRAFANA_DURATIONS = {"$__rate_interval": "1m", "$__interval": "1m"}


def exported_names() -> set[str]:
    """Every sample name the broker, a pipeline and the speed layer's roles expose."""
    import speedlayer.observability.metrics  # noqa: F401  (its metrics register in the default registry)

    idle_broker = SimpleNamespace(topics={})  # no topic: the families still come, without samples
    registries: list[CollectorRegistry] = [REGISTRY, broker_registry(BrokerCollector(idle_broker, 1, lambda: False)),
                                           PipelinePrometheus("p", "s").registry]
    names: set[str] = set()
    for registry in registries:
        for family in registry.collect():
            names.update(family.name + suffix for suffix in SAMPLE_SUFFIXES[family.type])
    return names


def metric_names(expr: str) -> list[str]:
    for variable, duration in GRAFANA_DURATIONS.items():
        expr = expr.replace(variable, duration)
    found: list[str] = []
    promql_parser.walk(promql_parser.parse(expr),
                       pre_visit=lambda node: found.append(node.name) if isinstance(node, promql_parser.VectorSelector)
                       else None)
    return found


def dashboard_queries(board: dict) -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every panel target and every `label_values(<selector>, label)` variable."""
    for panel in board["panels"]:
        for target in panel["targets"]:
            yield f"panel {panel['id']} {panel['title']!r} {target['refId']}", target["expr"]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"]
            assert query.startswith("label_values(") and query.endswith(")"), query
            yield f"variable {variable['name']}", query[len("label_values("):-1].rsplit(",", 1)[0]


def alert_queries() -> Iterator[tuple[str, str]]:
    for group in yaml.safe_load(ALERTS.read_text())["groups"]:
        for rule in group["rules"]:
            yield f"alert {rule['alert']}", rule["expr"]


def test_there_is_a_dashboard_per_component():
    assert [path.name for path in DASHBOARDS] == ["broker.json", "pipelines.json", "speedlayer.json"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_a_dashboard_imports_with_a_datasource_variable_and_unique_panel_ids(path):
    board = json.loads(path.read_text())
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids)), f"{path.name}: duplicate panel ids {ids}"
    variables = {variable["name"]: variable for variable in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for panel in board["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"] and all(t["datasource"] == panel["datasource"] for t in panel["targets"])
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36


def test_every_metric_a_dashboard_or_an_alert_reads_is_exported():
    exported = exported_names()
    queries = [*alert_queries(), *((f"{path.name} {where}", expr) for path in DASHBOARDS
                                   for where, expr in dashboard_queries(json.loads(path.read_text())))]
    unknown = {f"{where}: {name}" for where, expr in queries for name in metric_names(expr) if name not in exported}
    assert not unknown, f"metrics no component registers: {sorted(unknown)}"
    read = {name for _, expr in queries for name in metric_names(expr)}
    assert {"danube_subscription_lag_messages", "danube_pipeline_batch_duration_seconds_bucket",
            "danube_pipeline_rows_quarantined_total", "master_epochs", "master_workers_lost_total"} <= read


def test_an_unknown_metric_would_be_caught():
    assert "danube_pipeline_rows_typo_total" not in exported_names()
    assert metric_names("sum by (p) (rate(danube_pipeline_rows_typo_total[$__rate_interval]))") == [
        "danube_pipeline_rows_typo_total"]
