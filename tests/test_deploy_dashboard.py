"""The Grafana dashboard queries only series the server really exports.

Every PromQL expression in deploy/grafana/warmgate-dashboard.json (panel targets and template
variable queries) is reduced to the metric names and label names it uses; each name must be
one that warmgate.server.telemetry.metrics registers (with the suffixes Prometheus' text
format gives each type), and each label must be one that metric has or one Prometheus attaches to a
scraped target. When promtool is installed the expressions must also parse.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.metrics import MetricWrapperBase

from warmgate.server.telemetry.metrics import Metrics

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "warmgate-dashboard.json"

# Labels the PodMonitor's scrape adds to every series, and `le` of histogram buckets.
TARGET_LABELS = {"namespace", "pod", "container", "endpoint", "instance", "job", "service"}
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",),
            "histogram": ("_bucket", "_sum", "_count", "_created")}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
            "and", "or", "unless", "inf", "nan"}

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_GRAFANA_VAR = re.compile(r"\$\{?\w+\}?")
_SELECTOR = re.compile(r"([a-zA-Z_:][\w:]*)?\s*\{([^{}]*)\}")
_MATCHER_LABEL = re.compile(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
_RANGE = re.compile(r"\[[^\]]*\]")
_IDENT = re.compile(r"(?<![\w.])([a-zA-Z_:][\w:]*)(\s*\()?")


def exported_series() -> dict[str, set[str]]:
    """Sample name -> label names, for every metric the server's registry holds."""
    metrics = Metrics()
    labels_of = {m._name: set(m._labelnames)
                 for m in [*vars(metrics).values(), *vars(metrics.serving).values()]
                 if isinstance(m, MetricWrapperBase)}
    series: dict[str, set[str]] = {}
    for family in metrics.registry.collect():
        base = family.name
        # prometheus_client strips _total from a counter family's name.
        key = base + "_total" if family.type == "counter" else base
        if key not in labels_of and base not in labels_of:
            raise AssertionError(f"{base} is registered but not an attribute of Metrics")
        labels = labels_of.get(key, labels_of.get(base, set()))
        for suffix in SUFFIXES[family.type]:
            series[base + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return series


def expressions(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""

    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for p in items:
            yield p
            yield from panels(p.get("panels", []))

    for p in panels(dashboard["panels"]):
        for t in p.get("targets", []):
            yield f"panel {p['title']!r} target {t['refId']}", t["expr"]
    for v in dashboard["templating"]["list"]:
        if v["type"] == "query":
            query = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query)
            assert m, f"variable {v['name']}: expected label_values(selector, label)"
            yield f"variable {v['name']}", m.group(1)


def names_in(expr: str) -> tuple[set[str], dict[str, set[str]], set[str]]:
    """(metric names, metric -> labels in its selector, labels in by/without/on clauses)."""
    text = _STRING.sub('""', _GRAFANA_VAR.sub("5m", expr))
    selector_labels: dict[str, set[str]] = {}
    for metric, body in _SELECTOR.findall(text):
        labels = set(_MATCHER_LABEL.findall(body))
        if metric:
            selector_labels.setdefault(metric, set()).update(labels)
        elif "__name__" not in labels:
            raise AssertionError(f"a selector without a metric name: {{{body}}}")
    text = _SELECTOR.sub(lambda m: f" {m.group(1) or ''} ", text)
    grouping: set[str] = set()
    for _, labels in _GROUPING.findall(text):
        grouping.update(s.strip() for s in labels.split(",") if s.strip())
    text = _RANGE.sub(" ", _GROUPING.sub(" ", text))
    metrics = {name for name, call in _IDENT.findall(text)
               if not call and name.lower() not in KEYWORDS}
    return metrics, selector_labels, grouping


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def test_dashboard_has_a_prometheus_datasource_variable(dashboard: dict[str, Any]) -> None:
    assert 36 <= dashboard["schemaVersion"] <= 41
    (ds,) = [v for v in dashboard["templating"]["list"] if v["name"] == "datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    for p in dashboard["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}", p["title"]
            for t in p["targets"]:
                assert t["datasource"]["uid"] == "${datasource}", p["title"]


def test_every_expression_uses_only_exported_metrics_and_labels(
        dashboard: dict[str, Any]) -> None:
    series = exported_series()
    all_labels = set().union(*series.values()) | TARGET_LABELS
    problems = []
    for where, expr in expressions(dashboard):
        metrics, selector_labels, grouping = names_in(expr)
        if not metrics:
            problems.append(f"{where}: no metric in {expr!r}")
        for name in sorted(metrics - series.keys()):
            problems.append(f"{where}: {name} is not exported by warmgate.server.telemetry.metrics")
        for name, labels in selector_labels.items():
            for label in sorted(labels - series.get(name, set()) - TARGET_LABELS):
                problems.append(f"{where}: {name} has no label {label!r}")
        for label in sorted(grouping - all_labels):
            problems.append(f"{where}: no exported metric has label {label!r}")
    assert not problems, "\n".join(problems)


def test_dashboard_covers_the_warmup_signals(dashboard: dict[str, Any]) -> None:
    used: set[str] = set()
    after_ready = False
    for _, expr in expressions(dashboard):
        used |= names_in(expr)[0]
        after_ready |= 'warmgate_jit_compiles_total{after_ready="true"' in expr
    assert {"warmgate_phase_duration_seconds_bucket", "warmgate_phase_skipped_total",
            "warmgate_ready", "warmgate_jit_compiles_total",
            "warmgate_compile_cache_hits_total",
            "warmgate_compile_cache_misses_total"} <= used
    assert after_ready


def test_the_checker_catches_unknown_names() -> None:
    series = exported_series()
    metrics, selector_labels, grouping = names_in(
        'histogram_quantile(0.9, sum by (phase, le) (rate('
        'warmgate_phase_duration_seconds_bucket{phase="load", pod=~"$pod"}[$__rate_interval])))'
        ' / on (pod) group_left warmgate_no_such_metric')
    assert metrics == {"warmgate_phase_duration_seconds_bucket", "warmgate_no_such_metric"}
    assert metrics - series.keys() == {"warmgate_no_such_metric"}
    assert selector_labels == {"warmgate_phase_duration_seconds_bucket": {"phase", "pod"}}
    assert grouping == {"phase", "le", "pod"}
    assert "reason" in series["warmgate_phase_skipped_total"]
    assert "after_ready" in series["warmgate_jit_compiles_total"]


def test_expressions_parse_with_promtool(dashboard: dict[str, Any], tmp_path: Path) -> None:
    promtool = os.environ.get("PROMTOOL") or shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (.ci/deploy-checks installs it)")
    rules = ["groups:", "  - name: dashboard", "    rules:"]
    for i, (_, expr) in enumerate(expressions(dashboard)):
        # Grafana substitutes its variables before Prometheus sees the query.
        concrete = (expr.replace("$__rate_interval", "1m").replace("$__range", "6h")
                    .replace("$namespace", ".*").replace("$pod", ".*"))
        rules += [f"      - record: dashboard:expr{i}", f"        expr: {json.dumps(concrete)}"]
    path = tmp_path / "rules.yaml"
    path.write_text("\n".join(rules) + "\n")
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
