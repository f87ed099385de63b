"""Log lines of warmup results: one per phase as it ends (log_phase: the plan calls it live,
the server only for phases it made itself), and one summary per finished report."""

from __future__ import annotations

import json
import logging

from warmgate.server.core.results import PhaseResult, PhaseStatus, WarmupReport

logger = logging.getLogger("warmgate.server.report")


def log_phase(p: PhaseResult) -> None:
    reason = p.skip_reason.value if p.skip_reason else "-"
    level = logging.ERROR if p.status is PhaseStatus.FAILED else logging.INFO
    shapes = json.dumps(p.shapes, sort_keys=True, default=str, separators=(",", ":"))
    logger.log(level, "phase=%s status=%s seconds=%.3f reason=%s shapes=%s num_reqs=%d "
               "num_tokens=%d steps=%d detail=%s", p.name, p.status.value, p.duration_s,
               reason, shapes, p.num_reqs, p.num_tokens, p.num_steps, p.detail)


def log_report(report: WarmupReport) -> None:
    """The summary; the phases were logged as they ended."""
    logger.log(logging.INFO if report.succeeded else logging.ERROR,
               "warmup outcome=%s seconds=%.3f phases=%d config_hash=%s", report.outcome.value,
               report.total_duration_s, len(report.phases), report.config_hash)
