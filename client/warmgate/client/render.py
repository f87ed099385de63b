"""Text for the CLI: report tables, status lines and the live progress bar."""

from __future__ import annotations

import json
from typing import Any

from google.protobuf import duration_pb2, json_format
from google.protobuf.message import Message

from warmgate.v1 import warmup_pb2 as pb

BAR_WIDTH = 24
LOAD_PHASE = "load"  # the server's core.phases.LOAD; the client imports no server code
SETTLED = (pb.WARMUP_STATE_READY, pb.WARMUP_STATE_FAILED)


def to_json(message: Message) -> str:
    return json.dumps(to_dict(message), sort_keys=True)


def to_dict(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)


def seconds(d: duration_pb2.Duration) -> float:
    return d.ToNanoseconds() / 1e9


def enum_name(enum: Any, value: int, prefix: str) -> str:
    return enum.Name(value).removeprefix(prefix)


def report_table(report: pb.WarmupReport) -> str:
    """One row per phase, then the outcome line."""
    rows = [("phase", "status", "seconds", "reason", "detail")]
    for p in report.phases:
        reason = "" if p.skip_reason == pb.SKIP_REASON_UNSPECIFIED else \
            enum_name(pb.SkipReason, p.skip_reason, "SKIP_REASON_")
        rows.append((p.name, enum_name(pb.PhaseStatus, p.status, "PHASE_STATUS_"),
                     f"{seconds(p.duration):.3f}", reason, p.detail))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths, strict=True))
             + "  " + row[4] for row in rows]
    flags = [name for name, on in (("joined in-flight run", report.joined_in_flight),
                                   ("stored report", report.from_stored),
                                   ("deterministic", report.deterministic)) if on]
    lines.append(f"{outcome_summary(report)}  model={report.model} "
                 f"device={report.device} attention={report.attention_backend} "
                 f"config={report.config_hash}" + (f"  ({', '.join(flags)})" if flags else ""))
    return "\n".join(line.rstrip() for line in lines)


def outcome_summary(report: pb.WarmupReport) -> str:
    """`outcome SUCCEEDED in 33.598 s (load 2.273 s + warmup 31.325 s)`."""
    return (f"outcome {enum_name(pb.WarmupOutcome, report.outcome, 'WARMUP_OUTCOME_')} "
            f"in {_total(report)}")


def _total(report: pb.WarmupReport) -> str:
    """The run's wall time, split into the load and the warmup after it when the run loaded
    the model: the status line's elapsed time counts only the warmup."""
    total = seconds(report.total_duration)
    load = next((seconds(p.duration) for p in report.phases if p.name == LOAD_PHASE), None)
    if load is None:
        return f"{total:.3f} s"
    return f"{total:.3f} s (load {load:.3f} s + warmup {total - load:.3f} s)"


def state_name(status: pb.WarmupStatus) -> str:
    return enum_name(pb.WarmupState, status.state, "WARMUP_STATE_")


def _eta(status: pb.WarmupStatus) -> str:
    if not status.HasField("estimated_remaining"):
        return "eta ?"
    return f"eta {seconds(status.estimated_remaining):.1f}s"


def status_line(status: pb.WarmupStatus, *, elapsed: bool = True) -> str:
    """One plain line, for logs and non-TTY watches."""
    parts = [f"state={state_name(status)}"]
    if status.current_phase:
        parts += [f"phase={status.current_phase} ({status.phase_index + 1}/{status.num_phases})",
                  f"steps={status.steps_done}/{status.steps_total}", _eta(status)]
    if elapsed:
        parts.append(f"elapsed={seconds(status.elapsed):.1f}s")
    if status.failure_reason:
        parts.append(f"reason={status.failure_reason}")
    return " ".join(parts)


def watch_line(status: pb.WarmupStatus) -> str:
    """A `watch` line: the status line while a run goes on; once it settled with a report,
    the run's time as `status` gives it (the load named) instead of the warmup's alone."""
    if status.state in SETTLED and status.HasField("last_report"):
        return f"{status_line(status, elapsed=False)} {outcome_summary(status.last_report)}"
    return status_line(status)


def status_text(status: pb.WarmupStatus) -> str:
    """GetStatus for a person: the line, the runner's identity, the last report if any."""
    # Settled with a report: its outcome line gives the run's time (the load named in it),
    # so a second figure measured from another start (the warmup only) is left out.
    settled = status.state in SETTLED and status.HasField("last_report")
    lines = [status_line(status, elapsed=not settled),
             f"model={status.model} device={status.device} "
             f"attention={status.attention_backend} config={status.config_hash}"
             + ("  deterministic" if status.deterministic else "")]
    if status.HasField("compile_cache"):
        c = status.compile_cache
        lines.append(f"compile cache: {c.state} key={c.key[:16]} dir={c.directory} "
                     f"size={c.size_bytes / 2**20:.1f} MiB")
    if status.HasField("last_report"):
        lines += ["last report:", report_table(status.last_report)]
    return "\n".join(lines)


def progress_bar(status: pb.WarmupStatus) -> str:
    """A one-line bar for a TTY: phases done, then the current phase's steps."""
    if not status.current_phase or status.num_phases <= 0:
        return status_line(status)
    step_frac = status.steps_done / status.steps_total if status.steps_total else 0.0
    frac = min(1.0, (status.phase_index + step_frac) / status.num_phases)
    filled = round(frac * BAR_WIDTH)
    bar = "#" * filled + "." * (BAR_WIDTH - filled)
    return (f"[{bar}] {frac * 100:3.0f}% {status.current_phase} "
            f"{status.steps_done}/{status.steps_total}  elapsed {seconds(status.elapsed):.1f}s  "
            f"{_eta(status)}")
