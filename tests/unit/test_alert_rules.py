"""`deploy/prometheus/alerts.yml` through Prometheus' own `promtool`: the rules are valid, and the
recorded series of `tests/promtool/alerts_test.yml` fire each alert when they should (a
subscription falling behind fires within the rule's `for:` window) and not when they should not
(a steady subscription, an idle pipeline, a failover); every alert has both kinds of case."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.system_tools import require_tool

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = REPO / "tests" / "promtool" / "alerts_test.yml"


def promtool(*args: str) -> str:
    done = subprocess.run([require_tool("promtool"), *args], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"promtool {' '.join(args)}:\n{done.stdout}{done.stderr}"
    return done.stdout


def alert_names() -> list[str]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule["alert"] for group in groups for rule in group["rules"]]


def test_promtool_checks_the_rules():
    assert f"SUCCESS: {len(alert_names())} rules found" in promtool("check", "rules", str(ALERTS))


def test_recorded_series_fire_each_alert_when_they_should_and_only_then():
    assert "SUCCESS" in promtool("test", "rules", str(RULE_TESTS))


def test_every_alert_has_a_firing_and_a_quiet_case():
    cases = [case for test in yaml.safe_load(RULE_TESTS.read_text())["tests"] for case in test["alert_rule_test"]]
    for name in alert_names():
        outcomes = {bool(case["exp_alerts"]) for case in cases if case["alertname"] == name}
        assert outcomes == {True, False}, f"{name}: needs a case where it fires and one where it does not"
