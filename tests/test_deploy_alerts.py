"""deploy/base/prometheusrule.yaml asks only for series the server exports (a renamed metric
would leave an alert that can never fire), and covers what the deployment needs to page on.
promtool checks and unit-tests the rules in .ci/deploy-checks (.ci/alerts-test.yaml)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from prometheus_client import generate_latest

from warmgate.server.telemetry.metrics import Metrics

ROOT = Path(__file__).resolve().parents[1]
RULE = yaml.safe_load((ROOT / "deploy" / "base" / "prometheusrule.yaml").read_text())


def rules() -> list[dict[str, str]]:
    return [r for group in RULE["spec"]["groups"] for r in group["rules"]]


def exported_series() -> set[str]:
    text = generate_latest(Metrics().registry).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines()
            if line and not line.startswith("#")}


def test_every_series_an_alert_reads_is_exported() -> None:
    exported = exported_series()
    for rule in rules():
        for name in re.findall(r"\bwarmgate_\w+", rule["expr"]):
            assert name in exported, \
                f"{rule['alert']}: {name} is not a series the server exports"


def test_the_alerts_the_deployment_needs() -> None:
    assert {r["alert"] for r in rules()} == {
        "WarmgateWarmupFailed", "WarmgateNotReady", "WarmgateCompileAfterReady",
        "WarmgateCudaGraphMissAfterReady", "WarmgateCompileCacheDegraded",
        "WarmgateKvCacheNearlyFull"}
    for rule in rules():
        assert rule["labels"]["severity"] in ("critical", "warning")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
