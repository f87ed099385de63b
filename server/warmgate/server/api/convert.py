"""Domain objects <-> warmgate.v1 protos. Pure functions; the handlers stay thin."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from google.protobuf import duration_pb2

from warmgate.server.control.singleflight import Shared
from warmgate.server.control.status import StatusSnapshot, WarmupState
from warmgate.server.core.results import (
    PhaseResult,
    PhaseStatus,
    SkipReason,
    WarmupOutcome,
    WarmupReport,
)
from warmgate.v1 import warmup_pb2 as pb

logger = logging.getLogger(__name__)

_OUTCOMES = {
    WarmupOutcome.SUCCEEDED: pb.WARMUP_OUTCOME_SUCCEEDED,
    WarmupOutcome.FAILED: pb.WARMUP_OUTCOME_FAILED,
}
_PHASE_STATUSES = {
    PhaseStatus.RAN: pb.PHASE_STATUS_RAN,
    PhaseStatus.SKIPPED: pb.PHASE_STATUS_SKIPPED,
    PhaseStatus.FAILED: pb.PHASE_STATUS_FAILED,
}
_STATES = {
    WarmupState.PENDING: pb.WARMUP_STATE_PENDING,
    WarmupState.RUNNING: pb.WARMUP_STATE_RUNNING,
    WarmupState.READY: pb.WARMUP_STATE_READY,
    WarmupState.FAILED: pb.WARMUP_STATE_FAILED,
}


def skip_reason_to_proto(reason: SkipReason | None) -> pb.SkipReason.ValueType:
    """The proto enum mirrors results.SkipReason by name (SKIP_REASON_<NAME>).

    A reason added on the server side before the proto learns it is sent as UNSPECIFIED
    (the phase's detail still says why) rather than failing the whole RPC; a test keeps the
    two lists in step.
    """
    if reason is None:
        return pb.SKIP_REASON_UNSPECIFIED
    try:
        return pb.SkipReason.Value(f"SKIP_REASON_{reason.name}")
    except ValueError:
        logger.warning("skip reason %s has no proto value; sent as UNSPECIFIED", reason.name)
        return pb.SKIP_REASON_UNSPECIFIED


def duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(round(max(seconds, 0.0) * 1e9))
    return d


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))


def phase_to_proto(phase: PhaseResult) -> pb.PhaseResult:
    return pb.PhaseResult(
        name=phase.name, status=_PHASE_STATUSES[phase.status],
        skip_reason=skip_reason_to_proto(phase.skip_reason), detail=phase.detail,
        duration=duration(phase.duration_s), num_reqs=phase.num_reqs,
        num_tokens=phase.num_tokens, num_steps=phase.num_steps,
        compiles={str(k): int(v) for k, v in phase.compiles.items()},
        cache_hits=phase.cache_hits, cache_misses=phase.cache_misses,
        shapes={str(k): _json(v) for k, v in phase.shapes.items()})


def compile_cache_to_proto(info: dict[str, Any]) -> pb.CompileCache:
    """warmgate.server.cache.CacheInfo.to_dict() -> CompileCache."""
    return pb.CompileCache(
        state=str(info.get("state", "")), directory=str(info.get("directory", "")),
        key=str(info.get("key", "")), entry=str(info.get("entry", "")),
        size_bytes=int(info.get("size_bytes", 0)), detail=str(info.get("detail", "")),
        waited=duration(float(info.get("waited_s", 0.0))),
        degraded=bool(info.get("degraded", False)))


def report_to_proto(report: WarmupReport, *, joined_in_flight: bool = False,
                    from_stored: bool = False) -> pb.WarmupReport:
    out = pb.WarmupReport(
        outcome=_OUTCOMES[report.outcome], phases=[phase_to_proto(p) for p in report.phases],
        total_duration=duration(report.total_duration_s), config_hash=report.config_hash,
        joined_in_flight=joined_in_flight, from_stored=from_stored, device=report.device,
        attention_backend=report.attention_backend, model=report.model,
        deterministic=report.deterministic)
    if report.compile_cache:
        out.compile_cache.CopyFrom(compile_cache_to_proto(report.compile_cache))
    return out


def shared_report_to_proto(shared: Shared[WarmupReport]) -> pb.WarmupReport:
    return report_to_proto(shared.value, joined_in_flight=shared.joined_in_flight,
                           from_stored=shared.from_stored)


def status_to_proto(s: StatusSnapshot) -> pb.WarmupStatus:
    out = pb.WarmupStatus(
        state=_STATES[s.state], current_phase=s.current_phase, steps_done=s.steps_done,
        steps_total=s.steps_total, phase_index=s.phase_index, num_phases=s.num_phases,
        elapsed=duration(s.elapsed_s), failure_reason=s.failure_reason,
        config_hash=s.identity.config_hash, model=s.identity.model, device=s.identity.device,
        attention_backend=s.identity.attention_backend, work_in_flight=s.work_in_flight,
        server_pid=os.getpid(), cuda_graph_misses_after_ready=s.cuda_graph_misses_after_ready,
        not_serving_reason=s.not_serving_reason, deterministic=s.identity.deterministic)
    if s.estimated_remaining_s is not None:
        out.estimated_remaining.CopyFrom(duration(s.estimated_remaining_s))
    if s.last_report is not None:
        out.last_report.CopyFrom(report_to_proto(s.last_report))
    if s.compile_cache:
        out.compile_cache.CopyFrom(compile_cache_to_proto(s.compile_cache))
    return out
