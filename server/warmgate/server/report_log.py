"""One log line per phase of a finished report, with the numbers an operator greps for."""

from __future__ import annotations

import json
import logging

from warmgate.server.warmup.results import PhaseStatus, WarmupReport

logger = logging.getLogger("warmgate.server.report")


def log_report(report: WarmupReport) -> None:
    for p in report.phases:
        level = logging.ERROR if p.status is PhaseStatus.FAILED else logging.INFO
        reason = p.skip_reason.value if p.skip_reason else "-"
        shapes = json.dumps(p.shapes, sort_keys=True, default=str, separators=(",", ":"))
        logger.log(level, "phase=%s status=%s seconds=%.3f reason=%s shapes=%s detail=%s",
                   p.name, p.status.value, p.duration_s, reason, shapes, p.detail)
    logger.log(logging.INFO if report.succeeded else logging.ERROR,
               "warmup outcome=%s seconds=%.3f phases=%d config_hash=%s", report.outcome.value,
               report.total_duration_s, len(report.phases), report.config_hash)
