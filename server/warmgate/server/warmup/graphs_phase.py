"""The `cuda_graphs` phase: the dense linears' kernels chosen, then the graphs captured.

It starts once the dense-GEMM sweep has ended (the plan waits for it here), so the GPU is the
plan's alone: the runner times cuBLAS against the Triton GEMV for every dense linear of a few
rows (runner/linear_tuning.py), which must be fair timings and must come before the capture,
whose graphs hold the kernels chosen. The choice is made whether or not graphs are captured:
eager forwards after ready look it up too. With a compile cache the choices are kept in its
entry (cache/linear_choices.py): a warm start presets them and times nothing.
"""

from __future__ import annotations

import logging
from pathlib import Path

from warmgate.server.cache import shape_sweeps
from warmgate.server.cache.linear_choices import load_linear_choices, save_linear_choices
from warmgate.server.core.phases import CUDA_GRAPHS
from warmgate.server.core.results import PhaseResult, PhaseStatus, SkipReason
from warmgate.server.runner.linear_tuning import linear_choices_of, linear_timer, planned_keys
from warmgate.server.warmup.gemm_background import GemmSweepThread, finish_gemm_sweeps
from warmgate.server.warmup.kernel_probe import kernel_identity
from warmgate.server.warmup.runner_contract import WarmupRunner
from warmgate.server.warmup.steps import synced_timer

logger = logging.getLogger(__name__)


def cuda_graphs_step(runner: WarmupRunner, force: bool,
                     gemm_sweeps: list[GemmSweepThread]) -> PhaseResult:
    """Wait for the sweeps (what one raised fails this phase, the plan), choose the linears,
    capture (cuda_graphs_phase). The wait and the choice are said in the phase's shapes, not
    counted in its seconds."""
    waited = finish_gemm_sweeps(gemm_sweeps)
    linears = choose_kept_linears(runner)
    phase = cuda_graphs_phase(runner, force)
    if waited is not None:
        phase.shapes["waited_for_gemm_sweep_s"] = round(waited, 4)
    if linears:
        phase.shapes["dense_linears"] = linears
    return phase


def choose_kept_linears(runner: WarmupRunner, kernel_dir: Path | None = None
                        ) -> dict[str, object]:
    """runner.choose_linears, with the choices the compile cache entry keeps for this GPU and
    these libraries (cache/linear_choices.py) preset, so a warm start times nothing; a cold
    one keeps what it timed there. `kernel_dir`: default, the compile cache's."""
    choices = linear_choices_of(runner)
    kernel_dir = shape_sweeps.kernel_map_dir() if kernel_dir is None else kernel_dir
    if choices is None or linear_timer(runner, choices) is None or kernel_dir is None:
        return runner.choose_linears()
    from warmgate.server.kernels.linear_choices import key_name  # the ops imported triton

    identity = kernel_identity(runner.device)
    keys = planned_keys(runner, choices.max_m)
    by_name = {key_name(key): key for key in keys}
    kept, why = load_linear_choices(kernel_dir, identity, list(by_name))
    if kept is not None:
        choices.preset({by_name[name]: gemv for name, gemv in kept.items()})
    linears = runner.choose_linears()
    linears["source"] = "the compile cache" if kept is not None else f"timed ({why})"
    if kept is None:
        try:
            path = save_linear_choices(kernel_dir, identity, choices.by_name())
            logger.info("dense linears: choices kept in %s", path)
        except OSError as exc:  # a read-only or full cache volume costs the next start only
            logger.warning("dense linears: choices not kept (%s: %s): the next start times "
                           "them again", type(exc).__name__, exc)
    return linears


def cuda_graphs_phase(runner: WarmupRunner, force: bool) -> PhaseResult:
    """The capture, or why it is skipped."""
    cfg = runner.config
    if runner.device.type != "cuda":
        return PhaseResult.skipped(CUDA_GRAPHS, SkipReason.NO_CUDA,
                                   "CUDA graphs need a CUDA device; this runner is on "
                                   f"{runner.device.type}")
    if runner.is_pooling_model:
        return PhaseResult.skipped(CUDA_GRAPHS, SkipReason.POOLING_MODEL,
                                   "a pooling model never runs uniform decode batches")
    if not cfg.compilation.enable_cuda_graphs:
        return PhaseResult.skipped(CUDA_GRAPHS, SkipReason.DISABLED,
                                   "CUDA graphs are disabled by configuration")
    if not cfg.compilation.cuda_graph_sizes:
        return PhaseResult.skipped(CUDA_GRAPHS, SkipReason.NO_CAPTURE_SIZES,
                                   "no capture sizes are configured")
    if runner.cuda_graphs_captured and not force:
        return PhaseResult.skipped(CUDA_GRAPHS, SkipReason.ALREADY_CAPTURED,
                                   "graphs were captured by an earlier warmup; set force")
    with synced_timer(runner) as t:
        info = runner.capture_cuda_graphs()
    sizes, buckets = _ints(info.get("sizes")), _ints(info.get("ragged_buckets"))
    ragged = (f" and {len(buckets)} ragged-batch graphs (token buckets {buckets})" if buckets
              else "")
    return PhaseResult(name=CUDA_GRAPHS, status=PhaseStatus.RAN, duration_s=t[0],
                       num_steps=len(sizes) + len(buckets), num_reqs=max(sizes, default=0),
                       shapes=info, detail=f"captured {len(sizes)} uniform-decode graphs{ragged}")


def _ints(value: object) -> list[int]:
    """A list of ints from the capture's report (empty when it has none)."""
    return [v for v in value if isinstance(v, int)] if isinstance(value, list) else []

