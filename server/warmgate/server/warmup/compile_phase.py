"""The `compile` phase: one batch per torch.compile token bucket, so every graph the runner
can ever need is compiled before ready.

The compiled region depends on the padded token count only (attention, the only part that
reads the batch's layout, runs eagerly), so one prefill batch per bucket covers it: its
token count is the bucket itself when the KV cache and max_num_seqs allow, else the smallest
count that still lands in the bucket. A bucket no batch can reach (too few KV blocks for even
that) is listed as unreachable: no real batch can reach it either.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from warmgate.server.config.runner_config import cdiv
from warmgate.server.core.phases import COMPILE
from warmgate.server.core.progress import PhaseProgress, ProgressCallback
from warmgate.server.core.results import PhaseResult, PhaseStatus, SkipReason, WarmupResult
from warmgate.server.runner.scheduler_output import GREEDY
from warmgate.server.warmup.runner_contract import WarmupRunner
from warmgate.server.warmup.steps import (
    BlockAllocator,
    ExecuteModel,
    SampleTokens,
    blocks_for,
    finish,
    kv_block_sizes,
    new_request,
    run_step,
    scheduler_output,
    synced_timer,
)

if TYPE_CHECKING:
    from warmgate.server.warmup.gemm_background import GemmSweepThread
    from warmgate.server.warmup.gemm_shapes import GemmPlan

logger = logging.getLogger(__name__)


def buckets_to_warm(model_runner: WarmupRunner) -> tuple[int, ...]:
    """The buckets the phase compiles: all of the runner's (a seam for tests that leave one
    out on purpose)."""
    return tuple(model_runner.compile_buckets)


def prompt_layout(num_tokens: int, *, max_num_seqs: int, max_model_len: int,
                  block_sizes: Sequence[int], free_blocks: int) -> list[int] | None:
    """Prompt lengths of one prefill batch of exactly num_tokens tokens, or None if the
    limits (requests per batch, tokens per request, KV blocks) cannot hold it."""
    num_reqs = cdiv(num_tokens, max_model_len)
    if num_reqs > max_num_seqs:
        return None
    base, extra = divmod(num_tokens, num_reqs)
    lengths = [base + (i < extra) for i in range(num_reqs)]
    if sum(sum(blocks_for(n, block_sizes)) for n in lengths) > free_blocks:
        return None
    return lengths


def plan_batches(buckets: Sequence[int], *, max_num_seqs: int, max_model_len: int,
                 block_sizes: Sequence[int], free_blocks: int,
                 ) -> tuple[list[tuple[int, list[int]]], list[int]]:
    """[(bucket, prompt lengths)] for the buckets a batch can reach, and those it cannot."""
    fit = functools.partial(prompt_layout, max_num_seqs=max_num_seqs,
                            max_model_len=max_model_len, block_sizes=block_sizes,
                            free_blocks=free_blocks)
    batches, unreachable = [], []
    previous = 0
    for bucket in sorted(buckets):
        layout = fit(bucket) or fit(previous + 1)
        if layout is None:
            unreachable.append(bucket)
        else:
            batches.append((bucket, layout))
        previous = bucket
    return batches, unreachable


def run_compile_warmup(model_runner: WarmupRunner, worker_execute_model: ExecuteModel,
                       worker_sample_tokens: SampleTokens, *,
                       progress: ProgressCallback | None = None,
                       req_id_prefix: str = "_warmup_compile",
                       defer_gemms_to: list[GemmSweepThread] | None = None) -> WarmupResult:
    """Truthy iff it ran: the torch.compile buckets (--compile) and, on CUDA, the shape
    sweeps (--shape-sweeps: every dense GEMM shape, the sampler at every batch size);
    SKIPPED (DISABLED) when neither applies. Without torch.compile, `defer_gemms_to` takes
    the dense-GEMM sweep's thread still running (gemm_background.finish_gemm_sweeps waits)."""
    buckets = buckets_to_warm(model_runner)
    sweep = _runs_shape_sweeps(model_runner)
    if not buckets and not sweep:
        return WarmupResult.skipped(COMPILE, SkipReason.DISABLED,
                                    "torch.compile is off (--compile turns it on) and the "
                                    "shape sweeps run only on CUDA")
    if not buckets:
        return _gemm_only_phase(model_runner, progress, defer_gemms_to)
    block_sizes = kv_block_sizes(model_runner)
    batches, unreachable = plan_batches(
        buckets, max_num_seqs=model_runner.scheduler_config.max_num_seqs,
        max_model_len=model_runner.config.model.max_model_len, block_sizes=block_sizes,
        free_blocks=model_runner.kv_cache_config.num_blocks - 1)
    if unreachable:
        logger.warning("compile buckets %s cannot be reached by any batch (KV blocks or "
                       "max_num_seqs); not compiled", unreachable)
    is_pooling = bool(model_runner.is_pooling_model)
    vocab = model_runner.config.model.vocab_size
    execute, sample = worker_execute_model, worker_sample_tokens
    tracker = PhaseProgress(COMPILE, len(batches), progress)
    with synced_timer(model_runner) as t:
        for bucket, lengths in batches:
            ids = [f"{req_id_prefix}_{bucket}_{i}" for i in range(len(lengths))]
            alloc = BlockAllocator(len(block_sizes))
            new = [new_request(rid, [i % vocab for i in range(n)],
                               alloc.take(blocks_for(n, block_sizes)),
                               None if is_pooling else GREEDY)
                   for rid, n in zip(ids, lengths, strict=True)]
            try:
                run_step(execute, sample, scheduler_output(
                    new_reqs=new, num_scheduled=dict(zip(ids, lengths, strict=True))),
                    sample_after=not is_pooling)
            finally:
                finish(execute, ids)
            tracker.step()
        num_gemms = _sweep(model_runner) if sweep else 0
    warmed = [b for b, _ in batches]
    phase = PhaseResult(
        name=COMPILE, status=PhaseStatus.RAN, duration_s=t[0],
        num_reqs=max((len(lengths) for _, lengths in batches), default=0),
        num_tokens=max((sum(lengths) for _, lengths in batches), default=0),
        num_steps=len(batches), shapes={"buckets": warmed, "unreachable": unreachable},
        detail=f"compiled {len(warmed)} token buckets {warmed}; every batch pads up to one"
               + (f"; ran {num_gemms} shape-sweep calls" if sweep else ""))
    return WarmupResult(ran=True, phases=[phase])


def _runs_shape_sweeps(model_runner: WarmupRunner) -> bool:
    return (model_runner.device.type == "cuda"
            and model_runner.config.compilation.shape_sweeps)


def _sweep(model_runner: WarmupRunner, tracker: PhaseProgress | None = None,
           defer_to: list[GemmSweepThread] | None = None,
           plan: GemmPlan | None = None) -> int:
    """Dense GEMMs (and a MoE layer: moe_phase.sweep_moe_tokens) at every token count a
    forward can run outside a CUDA graph and
    (generative models) the sampler at every row count; the sampler, with the compile cache's
    kernel map, only at the sizes that launch every kernel. The GEMMs run on a thread of their
    own beside the sampler rows (gemm_background.py), except while those learn their map;
    with `defer_to`, the thread is left running there for the plan to wait for before the
    CUDA graphs (the phases between run beside it). A thread already in `defer_to` was started
    with the model (gemm_background.start_with_model) and is the sweep: none is started here.
    `plan`: gemm_plan's, when the caller has it already. Returns the calls made (or to be
    made)."""
    from warmgate.server.cache.shape_sweeps import kernel_map_dir
    from warmgate.server.warmup.gemm_background import GemmSweepThread  # torch, CUDA only
    from warmgate.server.warmup.gemm_shapes import gemm_plan, sweep_gemm_shapes
    from warmgate.server.warmup.moe_phase import sweep_moe_tokens
    from warmgate.server.warmup.sampler_rows import sampler_rows_learn, sweep_sampler_rows

    kernel_dir = kernel_map_dir()
    plan = gemm_plan(model_runner) if plan is None else plan
    moe_calls = sweep_moe_tokens(model_runner)
    started = list(defer_to or [])
    if model_runner.is_pooling_model or sampler_rows_learn(model_runner, kernel_dir):
        if started:  # ended before the sampler rows: the map must not see its GEMMs
            assert defer_to is not None  # where `started` came from
            defer_to.clear()
            calls = sum(thread.result() for thread in started)
            _steps(tracker, len(plan))
        else:
            calls = sweep_gemm_shapes(model_runner, tracker, plan=plan)
        if not model_runner.is_pooling_model:
            calls += sweep_sampler_rows(model_runner, kernel_dir=kernel_dir)
        return calls + moe_calls
    gemms = started[0] if started else GemmSweepThread(model_runner, plan)
    try:
        calls = sweep_sampler_rows(model_runner, kernel_dir=kernel_dir)
    except BaseException:
        gemms.wait()  # never leave it running past a failed phase
        raise
    if defer_to is not None:
        if not started:
            defer_to.append(gemms)
        calls += gemms.planned
    else:
        calls += gemms.result()
    _steps(tracker, len(plan))  # a step per weight, as the sweep on this thread reports them
    return calls + moe_calls


def _steps(tracker: PhaseProgress | None, count: int) -> None:
    if tracker is not None:
        for _ in range(count):
            tracker.step()


def _gemm_only_phase(model_runner: WarmupRunner, progress: ProgressCallback | None,
                     defer_to: list[GemmSweepThread] | None) -> WarmupResult:
    from warmgate.server.warmup.gemm_shapes import gemm_plan

    plan = gemm_plan(model_runner)
    tracker = PhaseProgress(COMPILE, len(plan) + 1, progress)
    with synced_timer(model_runner) as t:
        num_calls = _sweep(model_runner, tracker, defer_to, plan)
        tracker.step()
    running = bool(defer_to)  # what is still there runs on beside the next phases
    logger.info("compile phase: %d shape-sweep calls (dense GEMMs over %d weights, up to %d "
                "Ms each; sampler rows up to %d requests) in %.3f s%s", num_calls, len(plan),
                max((len(ms) for _, ms in plan), default=0), model_runner.max_num_reqs, t[0],
                "; the dense GEMMs go on beside the next phases, until before the CUDA graphs"
                if running else "")
    phase = PhaseResult(
        name=COMPILE, status=PhaseStatus.RAN, duration_s=t[0], num_tokens=num_calls,
        num_steps=len(plan), shapes={"gemm_weights": len(plan),
                                     "gemm_ms": [len(ms) for _, ms in plan]},
        detail=f"torch.compile is off; ran the dense GEMMs of {len(plan)} weights at every "
               "token count a forward can run outside a CUDA graph and the sampler at every "
               "batch size (with the compile cache's kernel map, at the sizes that launch "
               f"every sampler kernel), {num_calls} calls, so no first batch of a new size "
               "pays for algorithm choice or kernel loading"
               + ("; the GEMMs on a thread of their own, which the plan waits for before the "
                  "CUDA graphs" if running else ""))
    return WarmupResult(ran=True, phases=[phase])
