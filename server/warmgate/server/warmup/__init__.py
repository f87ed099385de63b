"""Warmup: plain functions over the runner, with the side-effecting steps passed in."""

from warmgate.server.core.progress import ProgressEvent
from warmgate.server.core.results import (
    PhaseResult,
    PhaseStatus,
    SkipReason,
    WarmupOutcome,
    WarmupReport,
    WarmupResult,
)
from warmgate.server.warmup.kernels import warmup_kernels
from warmgate.server.warmup.mixed import run_mixed_prefill_decode_warmup
from warmgate.server.warmup.plan import PHASES, load_runner, run_mixed_warmup, run_warmup_plan
from warmgate.server.warmup.steps import warmup_shapes

__all__ = [
    "PHASES",
    "PhaseResult",
    "PhaseStatus",
    "ProgressEvent",
    "SkipReason",
    "WarmupOutcome",
    "WarmupReport",
    "WarmupResult",
    "load_runner",
    "run_mixed_prefill_decode_warmup",
    "run_mixed_warmup",
    "run_warmup_plan",
    "warmup_kernels",
    "warmup_shapes",
]
