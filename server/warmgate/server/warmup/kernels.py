"""`warmup_kernels`: drive prefill, every decode shape and every sampler path once.

The logic follows vLLM's Model Runner V2 warmup; the shapes, num_reqs and their caps are
warmup/shapes.py's. The prefill's prompt_len = decode_query_len + 1 tokens, so a prefill
batch never has a uniform decode's shape (vLLM PR 40746); the runner also classifies by
whether a request is still reading its prompt, so no prefill step ever counts as a uniform
decode whatever its shape. The decode steps are `decode_plan`'s. The sampler paths that vLLM
once missed (greedy and seeded, vLLM issue 54455) get a batch each, beside stochastic
sampling, and so does every sampling feature (sampler_paths.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from warmgate.server.core.phases import DECODE, PREFILL, SAMPLER
from warmgate.server.core.progress import PhaseProgress, ProgressCallback
from warmgate.server.core.results import PhaseResult, PhaseStatus, SkipReason, WarmupResult
from warmgate.server.runner.scheduler_output import SamplingParams
from warmgate.server.warmup.runner_contract import WarmupRunner
from warmgate.server.warmup.sampler_paths import (
    FEATURE_VARIANTS,
    NOT_APPLICABLE,
    SAMPLER_VARIANTS,
    SEEDED,
    STOCHASTIC,
    sampler_batches,
)
from warmgate.server.warmup.shapes import kernel_shapes, kernel_shortfall
from warmgate.server.warmup.steps import (
    BlockAllocator,
    ExecuteModel,
    SampleTokens,
    WarmupRequest,
    blocks_for,
    finish,
    kv_block_sizes,
    new_request,
    run_step,
    scheduler_output,
    synced_timer,
)

logger = logging.getLogger(__name__)

# The sampler variants live in sampler_paths; bench reads them from here too.
__all__ = ["DECODE", "PREFILL", "SAMPLER", "SAMPLER_VARIANTS", "SEEDED", "STOCHASTIC",
           "decode_plan", "warmup_kernels", "warmup_shapes"]
# Called with each sub-phase's result as soon as it ends, so a later failure cannot lose it.
PhaseDone = Callable[[PhaseResult], None]


def warmup_shapes(model_runner: WarmupRunner) -> dict[str, int]:
    """The shapes warmup_kernels will use: prompt_len, decode_query_len, num_reqs and caps."""
    sched = model_runner.scheduler_config
    return kernel_shapes(num_spec_steps=model_runner.num_speculative_steps,
                         block_sizes=kv_block_sizes(model_runner),
                         num_blocks=model_runner.kv_cache_config.num_blocks,
                         max_num_seqs=sched.max_num_seqs,
                         max_num_batched_tokens=sched.max_num_batched_tokens,
                         max_model_len=model_runner.max_model_len)


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


def _precheck(model_runner: WarmupRunner, shapes: dict[str, int]) -> WarmupResult | None:
    short = kernel_shortfall(shapes, model_runner.scheduler_config.max_num_batched_tokens)
    if short is None:
        return None
    reason, _flag, detail = short
    return WarmupResult.skipped(PREFILL, reason, detail)


def _prefill(execute: ExecuteModel, sample: SampleTokens, reqs: Sequence[WarmupRequest],
             alloc: BlockAllocator, block_sizes: list[int], params: Sequence[SamplingParams],
             *, is_pooling: bool) -> None:
    new = []
    for req, sp in zip(reqs, params, strict=True):
        blocks = alloc.take(blocks_for(req.prompt_len, block_sizes))
        req.blocks = [len(b) for b in blocks]
        new.append(new_request(req.req_id, list(range(req.prompt_len)), blocks,
                               None if is_pooling else sp))
    so = scheduler_output(new_reqs=new, num_scheduled={r.req_id: r.prompt_len for r in reqs})
    run_step(execute, sample, so, sample_after=not is_pooling)
    for req in reqs:
        req.num_computed_tokens = req.prompt_len


def _decode(execute: ExecuteModel, sample: SampleTokens, reqs: Sequence[WarmupRequest],
            rows: Sequence[tuple[int, bool]], num_spec_steps: int, alloc: BlockAllocator,
            block_sizes: list[int], tokens_per_req: int) -> tuple[int, int]:
    """One decode step over `rows`; returns (tokens scheduled, requests restated back)."""
    cached, num_scheduled, spec_tokens = [], {}, {}
    restated = 0
    for idx, has_drafts in rows:
        req = reqs[idx]
        k = num_spec_steps if has_drafts else 0
        if req.num_computed_tokens + 1 + k > tokens_per_req:
            # Past its blocks or max_model_len: back to the end of its prompt (a scheduler
            # restates rejected drafts the same way); still a decode, never a prefill.
            req.num_computed_tokens = req.prompt_len
            restated += 1
        need = blocks_for(req.num_computed_tokens + 1 + k, block_sizes)
        delta = [max(0, n - h) for n, h in zip(need, req.blocks, strict=True)]
        new_blocks = alloc.take(delta) if any(d > 0 for d in delta) else None
        req.blocks = [max(n, h) for n, h in zip(need, req.blocks, strict=True)]
        cached.append((req.req_id, req.num_computed_tokens, new_blocks))
        num_scheduled[req.req_id] = 1 + k
        if k:
            # Draft token values do not matter for compilation; their count does.
            spec_tokens[req.req_id] = [0] * k
    run_step(execute, sample, scheduler_output(cached=cached, num_scheduled=num_scheduled,
                                               spec_tokens=spec_tokens))
    for idx, has_drafts in rows:
        reqs[idx].num_computed_tokens += 1 + (num_spec_steps if has_drafts else 0)
    return sum(num_scheduled.values()), restated


def _phase(name: str, seconds: float, num_reqs: int, num_tokens: int, steps: int,
           shapes: dict[str, Any], detail: str) -> PhaseResult:
    logger.debug("warmup phase=%s status=RAN seconds=%.3f num_reqs=%d num_tokens=%d steps=%d",
                name, seconds, num_reqs, num_tokens, steps)
    return PhaseResult(name=name, status=PhaseStatus.RAN, duration_s=seconds, num_reqs=num_reqs,
                       num_tokens=num_tokens, num_steps=steps, shapes=dict(shapes), detail=detail)


def warmup_kernels(model_runner: WarmupRunner, worker_execute_model: ExecuteModel,
                   worker_sample_tokens: SampleTokens, *,
                   progress: ProgressCallback | None = None,
                   req_id_prefix: str = "_warmup",
                   on_phase: PhaseDone | None = None) -> WarmupResult:
    """Run the prefill, decode and sampler warmups; truthy iff they ran.

    Returns one PhaseResult per sub-phase (kernels.prefill, kernels.decode, kernels.sampler),
    each also passed to `on_phase` as it ends. A pooling model runs the prefill only; the
    other two come back SKIPPED.
    """
    shapes = warmup_shapes(model_runner)
    skipped = _precheck(model_runner, shapes)
    if skipped is not None:
        logger.warning("warmup phase=%s status=SKIPPED reason=%s: %s", PREFILL,
                       skipped.skip_reason.value if skipped.skip_reason else "", skipped.detail)
        return skipped
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
            detail = "a pooling model never decodes or samples"
            done(PhaseResult.skipped(DECODE, SkipReason.POOLING_MODEL, detail))
            done(PhaseResult.skipped(SAMPLER, SkipReason.POOLING_MODEL, detail))
            return WarmupResult(ran=True, phases=phases)
        done(_warmup_decode(model_runner, execute, sample, reqs, alloc, block_sizes, shapes,
                            progress))
    finally:
        finish(execute, [r.req_id for r in reqs])

    done(_warmup_sampler(model_runner, execute, sample, shapes, block_sizes,
                         progress, req_id_prefix))
    return WarmupResult(ran=True, phases=phases)


def _warmup_prefill(model_runner: WarmupRunner, execute: ExecuteModel, sample: SampleTokens,
                    reqs: Sequence[WarmupRequest], alloc: BlockAllocator,
                    block_sizes: list[int], shapes: dict[str, int],
                    progress: ProgressCallback | None) -> PhaseResult:
    """Every request reads a prompt_len-token prompt, in one step."""
    num_reqs, prompt_len = shapes["num_reqs"], shapes["prompt_len"]
    tracker = PhaseProgress(PREFILL, 1, progress)
    with synced_timer(model_runner) as t:
        _prefill(execute, sample, reqs, alloc, block_sizes, [STOCHASTIC] * num_reqs,
                 is_pooling=bool(model_runner.is_pooling_model))
        tracker.step()
    return _phase(PREFILL, t[0], num_reqs, num_reqs * prompt_len, 1, shapes,
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
            n, r = _decode(execute, sample, reqs, rows, num_spec, alloc, block_sizes,
                           shapes["tokens_per_req"])
            tokens, restated = tokens + n, restated + r
            tracker.step()
    return _phase(DECODE, t[0], shapes["num_reqs"], tokens, len(plan),
                  {**shapes, "restated_requests": restated},
                  f"{len(plan)} decode steps, query length {shapes['decode_query_len']}; "
                  f"{restated} requests restated to {shapes['prompt_len']} computed tokens to "
                  f"stay within {shapes['tokens_per_req']} tokens")


def _warmup_sampler(model_runner: WarmupRunner, execute: ExecuteModel, sample: SampleTokens,
                    shapes: dict[str, int], block_sizes: list[int],
                    progress: ProgressCallback | None, req_id_prefix: str) -> PhaseResult:
    """Every batch of sampler_batches: a prefill, then its decode steps (sampler_paths.py
    says which paths and why)."""
    num_reqs, prompt_len = shapes["num_reqs"], shapes["prompt_len"]
    num_spec = model_runner.num_speculative_steps
    batches = sampler_batches(num_reqs, num_spec)
    tracker = PhaseProgress(SAMPLER, sum(1 + len(b.decodes) for b in batches), progress)
    tokens = 0
    with synced_timer(model_runner) as t:
        for batch in batches:
            reqs = [WarmupRequest(f"{req_id_prefix}_{batch.name}_{i}", prompt_len)
                    for i in range(num_reqs)]
            alloc = BlockAllocator(len(block_sizes))
            try:
                _prefill(execute, sample, reqs, alloc, block_sizes, batch.params,
                         is_pooling=False)
                tokens += num_reqs * prompt_len
                tracker.step()
                for with_drafts in batch.decodes:
                    rows = [(i, with_drafts) for i in range(num_reqs)]
                    tokens += _decode(execute, sample, reqs, rows, num_spec, alloc,
                                      block_sizes, shapes["tokens_per_req"])[0]
                    tracker.step()
            finally:
                finish(execute, [r.req_id for r in reqs])
    names = [b.name for b in batches]
    logger.info("warmup phase=%s sampler paths=%d (%s) num_reqs=%d spec_steps=%d", SAMPLER,
                len(names), ",".join(names), num_reqs, num_spec)
    return _phase(SAMPLER, t[0], num_reqs, tokens, tracker.steps_done,
                  {**shapes, "sampler_paths": names, "not_applicable": NOT_APPLICABLE},
                  "greedy, stochastic (temperature/top-k/top-p) and seeded batches, all three "
                  "mixed, then each sampling feature beside plain rows ("
                  + ", ".join(name for name, _ in FEATURE_VARIANTS)
                  + (", decoded with and without drafts" if num_spec else "")
                  + ") and every feature mixed; not applicable: CUDA graphs (the sampler "
                  "runs eagerly, outside the captured forward)")
