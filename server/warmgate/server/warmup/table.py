"""A plain-text phase table for terminals and logs."""

from __future__ import annotations

from warmgate.server.core.results import PhaseResult, WarmupReport

_COLUMNS = ("phase", "status", "reason", "seconds", "reqs", "tokens", "steps", "detail")


def _shapes(p: PhaseResult) -> str:
    return p.detail


def _row(p: PhaseResult) -> tuple[str, ...]:
    return (p.name, p.status.value, p.skip_reason.value if p.skip_reason else "-",
            f"{p.duration_s:.3f}", str(p.num_reqs or "-"), str(p.num_tokens or "-"),
            str(p.num_steps or "-"), _shapes(p))


def format_phase_table(report: WarmupReport) -> str:
    rows = [_COLUMNS, *(_row(p) for p in report.phases)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS) - 1)]
    lines = []
    for r in rows:
        cells = [c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)]
        lines.append("  ".join([*cells, r[-1]]).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths) + "  ------")
    lines.append(f"outcome {report.outcome.value} in {report.total_duration_s:.3f} s "
                 f"(model {report.model}, {report.device}, {report.attention_backend} attention, "
                 f"config {report.config_hash})")
    return "\n".join(lines)
