"""`warmup_kernels`: drive prefill, every decode shape and every sampler path once.

The logic follows vLLM's Model Runner V2 warmup; the shapes, num_reqs and their caps are
warmup/shapes.py's. The prefill's prompt_len = decode_query_len + 1 tokens, so a prefill
batch never has a uniform decode's shape (vLLM PR 40746); the runner also classifies by
whether a request is still reading its prompt, so no prefill step ever counts as a uniform
decode whatever its shape. The decode steps are `decode_plan`'s. The sampler paths that vLLM
once missed (greedy and seeded, vLLM issue 54455) get a batch each, beside stochastic
sampling, and so does every sampling feature (sampler_paths.py, sampler_phase.py).

The plan runs the forward half (`warmup_forward_kernels`: prefill and decode) before the CUDA
graphs and the sampler after them (plan.py says why); `warmup_kernels` runs all three in a row.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from warmgate.server.core.phases import DECODE, PREFILL, SAMPLER
from warmgate.server.core.progress import PhaseProgress, ProgressCallback
from warmgate.server.core.results import PhaseResult, SkipReason, WarmupResult
from warmgate.server.warmup.runner_contract import WarmupRunner
from warmgate.server.warmup.sampler_paths import SAMPLER_VARIANTS, SEEDED, STOCHASTIC
from warmgate.server.warmup.sampler_phase import warmup_sampler
from warmgate.server.warmup.steps import (
    POOLING_NEVER_SAMPLES,
    BlockAllocator,
    ExecuteModel,
    SampleTokens,
    WarmupRequest,
    decode_step,
    finish,
    kv_block_sizes,
    prefill_step,
    ran_phase,
    shortfall_skip,
    synced_timer,
    warmup_shapes,
)

logger = logging.getLogger(__name__)

# The sampler variants live in sampler_paths; bench reads them from here too.
__all__ = ["DECODE", "PREFILL", "SAMPLER", "SAMPLER_VARIANTS", "SEEDED", "STOCHASTIC",
           "decode_plan", "warmup_forward_kernels", "warmup_kernels", "warmup_shapes"]
# Called with each sub-phase's result as soon as it ends, so a later failure cannot lose it.
PhaseDone = Callable[[PhaseResult], None]


def decode_plan(num_reqs: int, num_spec_steps: int) -> list[list[tuple[int, bool]]]:
    """Decode steps as lists of (request index, has drafts); no step repeats another."""
    spec = num_spec_steps > 0
    steps = [[(i, spec) for i in range(num_reqs)]]
    if num_reqs >= 2:
        # A plain decode beside a speculative one: some kernels reclassify it.
        steps.append([(0, spec), (1, False)])
        if spec:
            steps.append([(0, False), (1, False)])
        # One request alone (with one request the first step already was).
        steps.append([(0, spec)])
    if spec:
        steps.append([(0, False)])
    return steps


def warmup_kernels(model_runner: WarmupRunner, worker_execute_model: ExecuteModel,
                   worker_sample_tokens: SampleTokens, *,
                   progress: ProgressCallback | None = None,
                   req_id_prefix: str = "_warmup",
                   on_phase: PhaseDone | None = None) -> WarmupResult:
    """Run the prefill, decode and sampler warmups in a row; truthy iff they ran.

    Returns one PhaseResult per sub-phase (kernels.prefill, kernels.decode, kernels.sampler),
    each also passed to `on_phase` as it ends. A pooling model runs the prefill only; the
    other two come back SKIPPED.
    """
    result = warmup_forward_kernels(model_runner, worker_execute_model, worker_sample_tokens,
                                    progress=progress, req_id_prefix=req_id_prefix,
                                    on_phase=on_phase)
    if not result.ran:
        return result
    sampler = warmup_sampler(model_runner, worker_execute_model, worker_sample_tokens,
                             progress=progress, req_id_prefix=req_id_prefix)
    if on_phase is not None:
        on_phase(sampler)
    return WarmupResult(ran=True, phases=[*result.phases, sampler])


def warmup_forward_kernels(model_runner: WarmupRunner, worker_execute_model: ExecuteModel,
                           worker_sample_tokens: SampleTokens, *,
                           progress: ProgressCallback | None = None,
                           req_id_prefix: str = "_warmup",
                           on_phase: PhaseDone | None = None) -> WarmupResult:
    """Run the prefill and decode warmups; truthy iff they ran.

    Returns kernels.prefill and kernels.decode (each also passed to `on_phase` as it ends); a
    pooling model's decode comes back SKIPPED. When the configuration cannot hold the
    warmup's requests, only kernels.prefill comes back, SKIPPED with the reason.
    """
    shapes = warmup_shapes(model_runner)
    skip = shortfall_skip(model_runner, shapes)
    if skip is not None:
        reason, detail = skip
        logger.warning("warmup phase=%s status=SKIPPED reason=%s: %s", PREFILL, reason.value,
                       detail)
        return WarmupResult.skipped(PREFILL, reason, detail)
    execute, sample = worker_execute_model, worker_sample_tokens
    block_sizes = kv_block_sizes(model_runner)
    phases: list[PhaseResult] = []

    def done(phase: PhaseResult) -> None:
        phases.append(phase)
        if on_phase is not None:
            on_phase(phase)

    # The decode steps continue the prefill's requests, so both run before they are finished.
    reqs = [WarmupRequest(f"{req_id_prefix}_{i}", shapes["prompt_len"])
            for i in range(shapes["num_reqs"])]
    alloc = BlockAllocator(len(block_sizes))
    try:
        done(_warmup_prefill(model_runner, execute, sample, reqs, alloc, block_sizes, shapes,
                             progress))
        if model_runner.is_pooling_model:
            done(PhaseResult.skipped(DECODE, SkipReason.POOLING_MODEL, POOLING_NEVER_SAMPLES))
        else:
            done(_warmup_decode(model_runner, execute, sample, reqs, alloc, block_sizes,
                                shapes, progress))
    finally:
        finish(execute, [r.req_id for r in reqs])
    return WarmupResult(ran=True, phases=phases)


def _warmup_prefill(model_runner: WarmupRunner, execute: ExecuteModel, sample: SampleTokens,
                    reqs: Sequence[WarmupRequest], alloc: BlockAllocator,
                    block_sizes: list[int], shapes: dict[str, int],
                    progress: ProgressCallback | None) -> PhaseResult:
    """Every request reads a prompt_len-token prompt, in one step."""
    num_reqs, prompt_len = shapes["num_reqs"], shapes["prompt_len"]
    tracker = PhaseProgress(PREFILL, 1, progress)
    with synced_timer(model_runner) as t:
        prefill_step(execute, sample, reqs, alloc, block_sizes, [STOCHASTIC] * num_reqs,
                     is_pooling=bool(model_runner.is_pooling_model))
        tracker.step()
    return ran_phase(PREFILL, t[0], num_reqs, num_reqs * prompt_len, 1, shapes,
                     f"{num_reqs} requests x {prompt_len} prompt tokens")


def _warmup_decode(model_runner: WarmupRunner, execute: ExecuteModel, sample: SampleTokens,
                   reqs: Sequence[WarmupRequest], alloc: BlockAllocator,
                   block_sizes: list[int], shapes: dict[str, int],
                   progress: ProgressCallback | None) -> PhaseResult:
    """The uniform batch, then the shapes that reclassify (decode_plan)."""
    num_spec = model_runner.num_speculative_steps
    plan = decode_plan(shapes["num_reqs"], num_spec)
    tracker = PhaseProgress(DECODE, len(plan), progress)
    tokens = restated = 0
    with synced_timer(model_runner) as t:
        for rows in plan:
            n, r = decode_step(execute, sample, reqs, rows, num_spec, alloc, block_sizes,
                               shapes["tokens_per_req"])
            tokens, restated = tokens + n, restated + r
            tracker.step()
    return ran_phase(DECODE, t[0], shapes["num_reqs"], tokens, len(plan),
                     {**shapes, "restated_requests": restated},
                     f"{len(plan)} decode steps, query length {shapes['decode_query_len']}; "
                     f"{restated} requests restated to {shapes['prompt_len']} computed tokens "
                     f"to stay within {shapes['tokens_per_req']} tokens")
