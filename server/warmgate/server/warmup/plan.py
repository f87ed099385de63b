"""The warmup plan: every warmup phase (docs/architecture.md), in order, each RAN, SKIPPED or
FAILED.

Order: load, flashinfer, moe, compile, kernels.prefill, kernels.decode, mixed, cuda_graphs,
kernels.sampler, structured. FlashInfer's JIT runs before the kernel warmups (as vLLM runs
its FlashInfer autotune before `warmup_kernels`) so its compile cost shows in its own phase
rather than inside prefill; the fused MoE kernel's launches (moe) and torch.compile's buckets
likewise. The dense GEMMs run on a thread
of their own, from the model's construction (a start-up's plan) or the compile phase on, beside
the phases, and the plan waits for them before the capture (warmup/gemm_background.py), then
chooses the kernel of each dense linear of a few rows (warmup/graphs_phase.py).

The two phases that vary only what runs after the forward, the sampler's paths and the
grammar's bitmask, come after the capture. Their decode steps then replay the captured graphs,
the forward serving takes for those batches, rather than eager forwards serving never runs
for them, and they no longer share the host with the GEMM thread. What they run after the
capture is what every serving step runs after it: the sampler and the bitmask live outside
any graph, and nothing the graphs read (the runner's input buffers, the KV cache, the
FlashInfer workspace) is allocated or grown by a step. So the hazard of vLLM 55336, a warmup
after capture growing a workspace that captured graphs still point at, has nothing to grow.
Each phase's `compiles` and cache counts come from the runner's JitMonitor, billed to the
phase whose step was running.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from warmgate.server.config.runner_config import RunnerConfig, resolve_runner_config
from warmgate.server.core.phases import (
    COMPILE,
    CUDA_GRAPHS,
    DECODE,
    DETERMINISM,
    DISTRIBUTED,
    FLASHINFER,
    LOAD,
    MIXED,
    MOE,
    PLAN_PHASES,
    PREFILL,
    SAMPLER,
    STRUCTURED,
    TP_PLAN_PHASES,
)
from warmgate.server.core.progress import PhaseProgress, ProgressCallback
from warmgate.server.core.results import (
    PhaseResult,
    PhaseStatus,
    SkipReason,
    WarmupOutcome,
    WarmupReport,
)
from warmgate.server.jit import JitMonitor
from warmgate.server.telemetry.report_log import log_phase
from warmgate.server.text.model_text import ModelText
from warmgate.server.warmup.compile_phase import run_compile_warmup
from warmgate.server.warmup.determinism import run_determinism_check
from warmgate.server.warmup.gemm_background import (
    GemmSweepThread,
    abandon_gemm_sweeps,
    start_with_model,
    starts_with_model,
    take_started,
)
from warmgate.server.warmup.graphs_phase import cuda_graphs_step
from warmgate.server.warmup.kernels import warmup_forward_kernels
from warmgate.server.warmup.mixed import run_mixed_prefill_decode_warmup
from warmgate.server.warmup.moe_phase import run_moe_warmup
from warmgate.server.warmup.phase_runner import PlanProgress, Step, run_phases
from warmgate.server.warmup.runner_contract import WarmupRunner
from warmgate.server.warmup.sampler_phase import warmup_sampler
from warmgate.server.warmup.shapes import RESOURCE_SKIPS, default_mixed_num_tokens
from warmgate.server.warmup.steps import synced_timer
from warmgate.server.warmup.structured import run_structured_warmup

logger = logging.getLogger(__name__)

PHASES = PLAN_PHASES  # warmgate.server.warmup.PHASES, as the tests and tools name it


def load_runner(config: RunnerConfig, *, jit_monitor: JitMonitor | None = None
                ) -> tuple[WarmupRunner, PhaseResult]:
    """Resolve the config, build the runner (weights, KV cache, backend) and time it.

    With a monitor, the compiler hooks this configuration needs are installed first (those
    that import the attention backend's library by the runner, once the weights are in and
    before the backend is built), so nothing compiles unseen.
    """
    from warmgate.server.jit.install import install_observers
    from warmgate.server.runner import ModelRunner  # lazy: torch-heavy

    start = time.perf_counter()
    resolved = resolve_runner_config(config)
    if jit_monitor is not None:
        install_observers(jit_monitor, resolved)
    if resolved.parallel.tensor_parallel_size > 1:
        from warmgate.server.distributed.build import build_tensor_parallel_runner

        runner: WarmupRunner = build_tensor_parallel_runner(resolved, jit_monitor)
    else:
        # The dense-GEMM sweep starts as soon as the model's tensors exist; the plan's compile
        # phase takes it over (gemm_background.take_started).
        started: list[GemmSweepThread] = []
        try:
            runner = ModelRunner(resolved, jit_monitor=jit_monitor, on_model_built=(
                (lambda built: started.append(start_with_model(built)))
                if starts_with_model(resolved) else None))
        except BaseException:
            abandon_gemm_sweeps(started)  # never left running past a failed load
            raise
    observers: list[str] = []
    if jit_monitor is not None:
        jit_monitor.install_pending()  # the runner did, before its backend; a no-op then
        observers = jit_monitor.observers
    seconds = time.perf_counter() - start
    stats = dataclasses.asdict(runner.load_stats)
    shapes = {"num_blocks": runner.kv_cache_config.num_blocks, **stats,
              "jit_observers": observers, "compile_buckets": list(runner.compile_buckets)}
    phase = PhaseResult(name=LOAD, status=PhaseStatus.RAN, duration_s=seconds, shapes=shapes,
                        detail=f"model {resolved.model.name} on {resolved.device.device} "
                               f"({resolved.device.dtype}, {resolved.device.attention_backend} "
                               "attention)")
    log_phase(phase)
    return runner, phase


def _flashinfer_phase(runner: WarmupRunner) -> PhaseResult:
    backend = runner.attention_backend.name  # --deterministic runs flashinfer's as triton
    if backend != "flashinfer":
        return PhaseResult.skipped(FLASHINFER, SkipReason.BACKEND_NOT_SELECTED,
                                   f"attention backend is {backend}, not flashinfer")
    with synced_timer(runner) as t:
        info = runner.attention_backend.jit_warmup() or {}
    steps = info.get("num_steps", 1)
    return PhaseResult(name=FLASHINFER, status=PhaseStatus.RAN, duration_s=t[0],
                       num_steps=steps if isinstance(steps, int) else 1, shapes=info,
                       detail="planned and JIT-compiled the prefill and decode wrappers")


def _require_resources(phases: list[PhaseResult]) -> list[PhaseResult]:
    """A plan phase skipped for lack of KV blocks, token budget or max_model_len fails the
    plan: serving takes that path, so ready would be a promise the warmup did not keep. The
    phases after it in the same step did not run because of it."""
    out: list[PhaseResult] = []
    for p in phases:
        if any(o.status is PhaseStatus.FAILED for o in out):
            out.append(PhaseResult.skipped(p.name, SkipReason.EARLIER_PHASE_FAILED,
                                           "not run: an earlier phase failed"))
        elif p.status is PhaseStatus.SKIPPED and p.skip_reason in RESOURCE_SKIPS:
            out.append(PhaseResult(name=p.name, status=PhaseStatus.FAILED,
                                   detail=f"serving needs this path but the configuration "
                                          f"cannot hold its warmup: {p.detail}"))
        else:
            out.append(p)
    return out


def run_warmup_plan(runner: WarmupRunner, *, load_phase: PhaseResult | None = None,
                    mixed_num_tokens: int | None = None,
                    progress: ProgressCallback | None = None,
                    force: bool = False, text: ModelText | None = None) -> WarmupReport:
    """Run every phase after `load` (whose result, if given, heads the report).

    `force` re-captures CUDA graphs that an earlier plan captured; without it that phase
    comes back SKIPPED (ALREADY_CAPTURED). `text`: the model's tokenizer and EOS ids as the
    server loaded them at start-up, for the structured phase (None: read from the model
    directory).
    """
    start = time.perf_counter()
    # Unset means the default; an explicit 0, 1 or 2 is kept, and the mixed phase skips it.
    num_tokens = (default_mixed_num_tokens(runner.scheduler_config.max_num_batched_tokens,
                                           runner.max_model_len)
                  if mixed_num_tokens is None else mixed_num_tokens)

    def kernels(report: PlanProgress) -> list[PhaseResult]:
        result = warmup_forward_kernels(runner, runner.execute_model, runner.sample_tokens,
                                        progress=report, on_phase=report.phase_done)
        return _require_resources(_with_skipped_tail(result.phases))

    def sampler(report: PlanProgress) -> list[PhaseResult]:
        return _require_resources([warmup_sampler(runner, runner.execute_model,
                                                  runner.sample_tokens, progress=report)])

    def mixed(report: PlanProgress) -> list[PhaseResult]:
        return _require_resources(run_mixed_prefill_decode_warmup(
            runner, runner.execute_model, runner.sample_tokens, num_tokens,
            progress=report).phases)

    # The dense-GEMM sweep, running on its own thread while the phases run (from the model's
    # construction on, or from the compile phase); waited for before the CUDA graphs
    # (warmup/gemm_background.py).
    gemm_sweeps: list[GemmSweepThread] = take_started(runner)

    def compile_buckets(report: PlanProgress) -> list[PhaseResult]:
        return run_compile_warmup(runner, runner.execute_model, runner.sample_tokens,
                                  progress=report, defer_gemms_to=gemm_sweeps).phases

    steps: list[Step] = [
        ((FLASHINFER,), lambda _: [_flashinfer_phase(runner)]),
        ((MOE,), lambda report: [run_moe_warmup(runner, progress=report)]),
        ((COMPILE,), compile_buckets),
        ((PREFILL, DECODE), kernels),
        ((MIXED,), mixed),
        ((CUDA_GRAPHS,), lambda _: [cuda_graphs_step(runner, force, gemm_sweeps)]),
        ((SAMPLER,), sampler),
        ((STRUCTURED,), lambda report: [run_structured_warmup(
            runner, runner.execute_model, runner.sample_tokens, text=text, progress=report)]),
        ((DETERMINISM,), lambda _: [run_determinism_check(
            runner, runner.execute_model, runner.sample_tokens)]),
    ]
    names: tuple[str, ...] = PHASES
    if getattr(runner, "tensor_parallel", None) is not None:
        from warmgate.server.warmup.distributed_phase import distributed_phase

        steps.insert(0, ((DISTRIBUTED,), lambda _: [distributed_phase(runner)]))
        names = TP_PLAN_PHASES
    phases = [load_phase] if load_phase is not None else []
    try:
        phases += run_phases(steps, progress, names, runner.jit_monitor)
    finally:
        abandon_gemm_sweeps(gemm_sweeps)  # a plan that stopped before the CUDA graphs
    return _report(runner, phases, time.perf_counter() - start
                   + (load_phase.duration_s if load_phase else 0.0))


def _with_skipped_tail(phases: list[PhaseResult]) -> list[PhaseResult]:
    """warmup_forward_kernels returns only the phases it reached when it skips up front."""
    names = [p.name for p in phases]
    out = list(phases)
    first = phases[0] if phases else None
    for name in (PREFILL, DECODE):
        if name not in names and first is not None and first.skip_reason is not None:
            out.append(PhaseResult.skipped(name, first.skip_reason, first.detail))
    return out


def run_mixed_warmup(runner: WarmupRunner, num_tokens: int, *,
                     progress: ProgressCallback | None = None) -> WarmupReport:
    """The MixedWarmup RPC's work: a report with the one `mixed` phase."""
    start = time.perf_counter()
    phases = run_phases([((MIXED,), lambda report: run_mixed_prefill_decode_warmup(
        runner, runner.execute_model, runner.sample_tokens, num_tokens,
        progress=report).phases)], progress, (MIXED,), runner.jit_monitor)
    return _report(runner, phases, time.perf_counter() - start)


def _report(runner: WarmupRunner, phases: list[PhaseResult], seconds: float) -> WarmupReport:
    failed = any(p.status is PhaseStatus.FAILED for p in phases)
    cfg = runner.config
    report = WarmupReport(
        outcome=WarmupOutcome.FAILED if failed else WarmupOutcome.SUCCEEDED, phases=phases,
        total_duration_s=seconds, config_hash=cfg.config_hash(), device=cfg.device.device,
        attention_backend=cfg.device.attention_backend, model=cfg.model.name,
        deterministic=cfg.numerics.deterministic)
    return report  # its summary line is the caller's (the server's report_log)


__all__ = ["PHASES", "PhaseProgress", "load_runner", "run_mixed_warmup", "run_warmup_plan"]
