"""The deployment docs describe the server as it is: no flag the server has is called planned
or missing, and every warmgate-server flag they name exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from warmgate.server.config.server_config import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "deploy" / "README.md", *sorted((ROOT / "deploy").rglob("*.yaml"))]
FUTURE = re.compile(r"\b(planned|not yet in the server|will serve|to come)\b", re.I)


def server_flags() -> set[str]:
    return {opt for action in build_parser({})._actions for opt in action.option_strings
            if opt.startswith("--")}


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_existing_flag_is_described_as_future(path: Path) -> None:
    flags = server_flags()
    # Paragraphs, so a sentence broken over lines is read whole.
    for paragraph in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")):
        if FUTURE.search(paragraph):
            named = set(re.findall(r"--[a-z][a-z0-9-]+", paragraph)) & flags
            assert not named, f"{path.name}: {sorted(named)} exist but read as future: " \
                              f"{paragraph.strip()[:200]}"


def _metrics_table() -> str:
    text = (ROOT / "deploy" / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    return "\n".join(line for line in section.splitlines() if line.startswith("|"))


def test_the_metrics_table_lists_every_metric_and_skip_reason() -> None:
    from warmgate.server.telemetry.metrics import SKIP_REASONS, Metrics

    table = _metrics_table()
    names = {metric.name for metric in Metrics().registry.collect()}
    # Counters are collected under their name without _total.
    listed = set(re.findall(r"`(warmgate_[a-z_]+?)(?:_total)?`", table))
    assert names - listed == set(), f"registered but not in deploy/README.md: {names - listed}"
    assert listed - names == set(), f"in deploy/README.md but not registered: {listed - names}"
    skip_row = next(line for line in table.splitlines() if "warmgate_phase_skipped_total" in line)
    missing = [r for r in SKIP_REASONS if not re.search(rf"\b{r}\b", skip_row)]
    assert not missing, f"skip reasons missing from the metrics table: {missing}"
