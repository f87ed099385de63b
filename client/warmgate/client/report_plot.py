"""Draw a warmup report as a phase timeline (PNG): one bar per phase, laid end to end.

Phases run one after another, so each starts where the ones before it ended (the cumulative
sum of durations). A bar is coloured by how the phase ended; a skipped phase takes no time and
is drawn as a marker carrying its reason.

matplotlib is imported only when a plot is drawn (the `plot` extra): the client itself never
needs it. The Agg canvas is used directly, without pyplot, so no global backend is switched.

The input is a WarmupReport as JSON, in either form warmgate prints:
  - `python -m warmgate.server.run_warmup --json`: status "RAN", skip_reason "MAX_NUM_REQS_LT_2"
    or null, duration_s 1.5, total_duration_s;
  - `warmgate --json warmup` (protobuf JSON): status "PHASE_STATUS_RAN", skip_reason
    "SKIP_REASON_..." (or skipReason), duration "1.500s", total_duration (or totalDuration).
A WarmupStatus (`warmgate --json status`) is accepted too: its last_report is drawn.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

COLORS = {"RAN": "#2e7d32", "SKIPPED": "#9e9e9e", "FAILED": "#c62828"}
WIDTH_IN = 10.0
ROW_IN = 0.42
MARGIN_IN = 1.0
DPI = 120
_DURATION = re.compile(r"^\s*(-?\d+(?:\.\d+)?)s\s*$")


class ReportError(ValueError):
    """The input is not a warmup report this module can draw."""


class PlotDependencyError(RuntimeError):
    """matplotlib is not installed (it comes with the `plot` extra)."""


@dataclass(frozen=True)
class TimelinePhase:
    name: str
    status: str  # RAN, SKIPPED or FAILED
    start_s: float
    duration_s: float
    skip_reason: str | None
    detail: str


def _field(d: dict[str, Any], snake: str, default: Any = None) -> Any:
    """A field by its proto name or its lowerCamelCase JSON name."""
    if snake in d:
        return d[snake]
    head, *rest = snake.split("_")
    return d.get(head + "".join(w.title() for w in rest), default)


def _seconds(phase: dict[str, Any], float_key: str, proto_key: str) -> float:
    value = _field(phase, float_key)
    if value is None:
        value = _field(phase, proto_key)
    if value is None:
        return 0.0
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        m = _DURATION.match(value)
        if not m:
            raise ReportError(f"{proto_key}: {value!r} is not a protobuf Duration like '1.5s'")
        return float(m.group(1))
    if isinstance(value, dict):  # {"seconds": ..., "nanos": ...}
        return float(value.get("seconds", 0)) + float(value.get("nanos", 0)) / 1e9
    raise ReportError(f"{proto_key}: unexpected {type(value).__name__}")


def _enum(value: Any, prefix: str) -> str | None:
    if value is None or value == "":
        return None
    text = str(value).removeprefix(prefix)
    return None if text == "UNSPECIFIED" else text


def unwrap_report(data: dict[str, Any]) -> dict[str, Any]:
    """The report inside a WarmupStatus, or the report itself."""
    if not isinstance(data, dict):
        raise ReportError(f"expected a JSON object, got {type(data).__name__}")
    if "phases" in data:
        return data
    inner = _field(data, "last_report")
    if isinstance(inner, dict) and "phases" in inner:
        return inner
    raise ReportError("no 'phases' here: expected a WarmupReport (or a WarmupStatus with a "
                      "last_report); has a warmup finished yet?")


def timeline(report: dict[str, Any]) -> list[TimelinePhase]:
    """Phases in order, each starting where the previous one ended."""
    report = unwrap_report(report)
    out: list[TimelinePhase] = []
    start = 0.0
    for raw in report["phases"]:
        status = _enum(raw.get("status"), "PHASE_STATUS_") or "RAN"
        if status not in COLORS:
            raise ReportError(f"phase {raw.get('name')!r}: unknown status {status!r}")
        duration = max(0.0, _seconds(raw, "duration_s", "duration"))
        out.append(TimelinePhase(name=str(raw.get("name", "?")), status=status, start_s=start,
                                 duration_s=duration,
                                 skip_reason=_enum(_field(raw, "skip_reason"), "SKIP_REASON_"),
                                 detail=str(raw.get("detail", ""))))
        start += duration
    return out


def total_seconds(report: dict[str, Any]) -> float:
    report = unwrap_report(report)
    total = _seconds(report, "total_duration_s", "total_duration")
    return total or sum(p.duration_s for p in timeline(report))


def figure_size_px(num_phases: int) -> tuple[int, int]:
    """Width and height of the PNG that plot_report writes for this many phases."""
    return (round(WIDTH_IN * DPI), round((MARGIN_IN + ROW_IN * max(num_phases, 1)) * DPI))


def _fmt_s(seconds: float) -> str:
    if seconds >= 10:
        return f"{seconds:.1f} s"
    if seconds >= 0.1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1000:.1f} ms"


def _title(report: dict[str, Any], phases: list[TimelinePhase]) -> str:
    outcome = _enum(report.get("outcome"), "WARMUP_OUTCOME_") or "?"
    who = ", ".join(str(v) for v in (report.get("model"), report.get("device"),
                                     _field(report, "attention_backend")) if v)
    head = f"warmup {outcome} in {_fmt_s(total_seconds(report))}"
    return f"{head}  ({who})" if who else head


def plot_report(report: dict[str, Any], path: str) -> None:
    """Write the phase timeline of `report` to `path` as a PNG."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError as exc:
        raise PlotDependencyError("plotting needs matplotlib (warmgate's [plot] extra): "
                                  "pip install matplotlib") from exc

    report = unwrap_report(report)
    phases = timeline(report)
    if not phases:
        raise ReportError("the report has no phases")
    width_px, height_px = figure_size_px(len(phases))
    fig = Figure(figsize=(width_px / DPI, height_px / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()

    end = max(p.start_s + p.duration_s for p in phases)
    span = end if end > 0 else 1.0
    # Room on the right for the last bar's label.
    ax.set_xlim(0, span * 1.32)
    ax.set_ylim(len(phases) - 0.4, -0.6)
    pad = span * 0.01
    for row, p in enumerate(phases):
        color = COLORS[p.status]
        if p.status == "SKIPPED":
            ax.plot([p.start_s], [row], marker="D", markersize=7, color=color, zorder=3)
            reason = (p.skip_reason or "skipped").lower().replace("_", " ")
            ax.text(p.start_s + pad * 1.5, row, f"skipped: {reason}", va="center",
                    ha="left", fontsize=8.5, color="#616161", style="italic")
            continue
        ax.barh(row, p.duration_s, left=p.start_s, height=0.62, color=color,
                edgecolor="white", linewidth=0.5, zorder=2)
        label = _fmt_s(p.duration_s) + ("  FAILED" if p.status == "FAILED" else "")
        ax.text(p.start_s + p.duration_s + pad, row, label, va="center", ha="left",
                fontsize=8.5, color=color if p.status == "FAILED" else "#212121",
                fontweight="bold" if p.status == "FAILED" else "normal")

    ax.set_yticks(range(len(phases)), [p.name for p in phases], fontsize=9)
    ax.set_xlabel("seconds since warmup start (phases run one after another)", fontsize=9)
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(axis="x", color="#e0e0e0", linewidth=0.6, zorder=0)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.set_title(_title(report, phases), fontsize=10.5, loc="left")
    present = [s for s in COLORS if any(p.status == s for p in phases)]
    # Above the plot, right of the title: never over a bar or a label.
    ax.legend(handles=[Patch(color=COLORS[s], label=s) for s in present], loc="lower right",
              bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False, ncols=len(present),
              handlelength=1.2, borderaxespad=0.2)
    fig.savefig(path, format="png", dpi=DPI)
