"""`warmup_kernels`: drive prefill, every decode shape and every sampler path once.

The logic follows vLLM's Model Runner V2 warmup:
- the prefill uses prompt_len = decode_query_len + 1 = 2 + num_spec_steps tokens per request,
  so a prefill batch is never classified as a uniform decode and prefill kernels compile
  (vLLM PR 40746);
- num_reqs = min(max_num_seqs, max_num_batched_tokens // max(prompt_len, decode_query_len),
  max(1, (num_blocks - 1) // max_blocks_per_req)), block 0 being the null block;
- each request's blocks are sized for the worst case, prompt_len + steps * decode_query_len;
- decode steps: all requests; requests [0, 1] with [spec, plain] drafts; with speculation also
  [plain, plain]; then single requests: 3 steps without speculation, 5 with;
- the sampler paths that vLLM once missed (greedy and seeded, vLLM issue 54455) get a batch
  each, beside stochastic sampling.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from warmgate.server.runner.scheduler_output import GREEDY, SamplingParams
from warmgate.server.warmup.progress import PhaseProgress, ProgressCallback
from warmgate.server.warmup.results import PhaseResult, PhaseStatus, SkipReason, WarmupResult
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

PREFILL, DECODE, SAMPLER = "kernels.prefill", "kernels.decode", "kernels.sampler"
# Stochastic sampling that exercises temperature, top-k and top-p together.
STOCHASTIC = SamplingParams(temperature=0.8, top_k=20, top_p=0.9)
SEEDED = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=1234)
SAMPLER_VARIANTS: tuple[tuple[str, SamplingParams], ...] = (
    ("greedy", GREEDY), ("stochastic", STOCHASTIC), ("seeded", SEEDED))


def num_decode_steps(num_spec_steps: int) -> int:
    return 5 if num_spec_steps > 0 else 3


def warmup_shapes(model_runner: Any) -> dict[str, int]:
    """The shapes warmup_kernels will use: prompt_len, decode_query_len, num_reqs and caps."""
    num_spec_steps = model_runner.num_speculative_steps
    decode_query_len = 1 + num_spec_steps
    prompt_len = 2 + num_spec_steps
    worst_len = prompt_len + num_decode_steps(num_spec_steps) * decode_query_len
    max_blocks_per_req = sum(blocks_for(worst_len, kv_block_sizes(model_runner)))
    sched = model_runner.scheduler_config
    num_blocks = model_runner.kv_cache_config.num_blocks
    cap_seqs = sched.max_num_seqs
    cap_tokens = sched.max_num_batched_tokens // max(prompt_len, decode_query_len)
    cap_blocks = max(1, (num_blocks - 1) // max_blocks_per_req)
    return dict(prompt_len=prompt_len, decode_query_len=decode_query_len,
                num_reqs=min(cap_seqs, cap_tokens, cap_blocks), cap_max_num_seqs=cap_seqs,
                cap_max_num_batched_tokens=cap_tokens, cap_kv_blocks=cap_blocks,
                max_blocks_per_req=max_blocks_per_req, num_blocks=num_blocks,
                worst_len=worst_len)


def decode_plan(num_reqs: int, num_spec_steps: int) -> list[list[tuple[int, bool]]]:
    """Decode steps as lists of (request index, has drafts)."""
    spec = num_spec_steps > 0
    steps = [[(i, spec) for i in range(num_reqs)]]
    if num_reqs >= 2:
        # A plain decode beside a speculative one: some kernels reclassify it.
        steps.append([(0, spec), (1, False)])
        if spec:
            steps.append([(0, False), (1, False)])
    steps.append([(0, spec)])
    if spec:
        steps.append([(0, False)])
    return steps


def _precheck(model_runner: Any, shapes: dict[str, int]) -> WarmupResult | None:
    if shapes["cap_max_num_batched_tokens"] < 1:
        return WarmupResult.skipped(
            PREFILL, SkipReason.TOKEN_BUDGET_TOO_SMALL,
            f"max_num_batched_tokens ({model_runner.scheduler_config.max_num_batched_tokens}) "
            f"is below one warmup prompt ({shapes['prompt_len']} tokens); raise "
            "--max-num-batched-tokens")
    if shapes["num_blocks"] - 1 < shapes["max_blocks_per_req"]:
        return WarmupResult.skipped(
            PREFILL, SkipReason.INSUFFICIENT_KV_BLOCKS,
            f"one warmup request needs {shapes['max_blocks_per_req']} KV blocks but only "
            f"{shapes['num_blocks'] - 1} exist besides the null block; raise --num-blocks")
    return None


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
            block_sizes: list[int]) -> int:
    """One decode step over `rows`; returns the number of tokens scheduled."""
    cached, num_scheduled, spec_tokens = [], {}, {}
    for idx, has_drafts in rows:
        req = reqs[idx]
        k = num_spec_steps if has_drafts else 0
        need = blocks_for(req.num_computed_tokens + 1 + k, block_sizes)
        delta = [n - h for n, h in zip(need, req.blocks, strict=True)]
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
    return sum(num_scheduled.values())


def _phase(name: str, seconds: float, num_reqs: int, num_tokens: int, steps: int,
           shapes: dict[str, Any], detail: str) -> PhaseResult:
    logger.debug("warmup phase=%s status=RAN seconds=%.3f num_reqs=%d num_tokens=%d steps=%d",
                name, seconds, num_reqs, num_tokens, steps)
    return PhaseResult(name=name, status=PhaseStatus.RAN, duration_s=seconds, num_reqs=num_reqs,
                       num_tokens=num_tokens, num_steps=steps, shapes=dict(shapes), detail=detail)


def warmup_kernels(model_runner: Any, worker_execute_model: ExecuteModel,
                   worker_sample_tokens: SampleTokens, *,
                   progress: ProgressCallback | None = None,
                   req_id_prefix: str = "_warmup") -> WarmupResult:
    """Run the prefill, decode and sampler warmups; truthy iff they ran.

    Returns one PhaseResult per sub-phase (kernels.prefill, kernels.decode, kernels.sampler).
    A pooling model runs the prefill only; the other two come back SKIPPED.
    """
    shapes = warmup_shapes(model_runner)
    skipped = _precheck(model_runner, shapes)
    if skipped is not None:
        logger.warning("warmup phase=%s status=SKIPPED reason=%s: %s", PREFILL,
                       skipped.skip_reason.value if skipped.skip_reason else "", skipped.detail)
        return skipped
    num_spec = model_runner.num_speculative_steps
    is_pooling = bool(model_runner.is_pooling_model)
    block_sizes = kv_block_sizes(model_runner)
    num_reqs, prompt_len = shapes["num_reqs"], shapes["prompt_len"]
    execute, sample = worker_execute_model, worker_sample_tokens
    phases: list[PhaseResult] = []

    # 1. Prefill: every request reads a prompt_len-token prompt.
    reqs = [WarmupRequest(f"{req_id_prefix}_{i}", prompt_len) for i in range(num_reqs)]
    alloc = BlockAllocator(len(block_sizes))
    tracker = PhaseProgress(PREFILL, 1, progress)
    try:
        with synced_timer(model_runner) as t:
            _prefill(execute, sample, reqs, alloc, block_sizes, [STOCHASTIC] * num_reqs,
                     is_pooling=is_pooling)
            tracker.step()
        phases.append(_phase(PREFILL, t[0], num_reqs, num_reqs * prompt_len, 1, shapes,
                             f"{num_reqs} requests x {prompt_len} prompt tokens"))
        if is_pooling:
            detail = "a pooling model never decodes or samples"
            phases += [PhaseResult.skipped(DECODE, SkipReason.POOLING_MODEL, detail),
                       PhaseResult.skipped(SAMPLER, SkipReason.POOLING_MODEL, detail)]
            return WarmupResult(ran=True, phases=phases)

        # 2. Decode: the uniform batch, then the shapes that reclassify.
        plan = decode_plan(num_reqs, num_spec)
        tracker = PhaseProgress(DECODE, len(plan), progress)
        tokens = 0
        with synced_timer(model_runner) as t:
            for rows in plan:
                tokens += _decode(execute, sample, reqs, rows, num_spec, alloc, block_sizes)
                tracker.step()
        phases.append(_phase(DECODE, t[0], num_reqs, tokens, len(plan), shapes,
                             f"{len(plan)} decode steps, query length "
                             f"{shapes['decode_query_len']}"))
    finally:
        finish(execute, [r.req_id for r in reqs])

    phases.append(_warmup_sampler(model_runner, execute, sample, shapes, block_sizes,
                                  progress, req_id_prefix))
    return WarmupResult(ran=True, phases=phases)


def _warmup_sampler(model_runner: Any, execute: ExecuteModel, sample: SampleTokens,
                    shapes: dict[str, int], block_sizes: list[int],
                    progress: ProgressCallback | None, req_id_prefix: str) -> PhaseResult:
    """Each sampler path gets its own batch (a prefill, then a decode), then one batch mixes
    them all, because an all-greedy batch takes a different path from a mixed one."""
    num_reqs, prompt_len = shapes["num_reqs"], shapes["prompt_len"]
    num_spec = model_runner.num_speculative_steps
    tracker = PhaseProgress(SAMPLER, 2 * len(SAMPLER_VARIANTS) + 1, progress)
    tokens = 0
    with synced_timer(model_runner) as t:
        for variant, params in SAMPLER_VARIANTS:
            reqs = [WarmupRequest(f"{req_id_prefix}_{variant}_{i}", prompt_len)
                    for i in range(num_reqs)]
            alloc = BlockAllocator(len(block_sizes))
            try:
                _prefill(execute, sample, reqs, alloc, block_sizes, [params] * num_reqs,
                         is_pooling=False)
                tracker.step()
                rows = [(i, num_spec > 0) for i in range(num_reqs)]
                tokens += num_reqs * prompt_len
                tokens += _decode(execute, sample, reqs, rows, num_spec, alloc, block_sizes)
                tracker.step()
            finally:
                finish(execute, [r.req_id for r in reqs])
        mixed = [p for _, p in SAMPLER_VARIANTS]
        reqs = [WarmupRequest(f"{req_id_prefix}_mixsample_{i}", prompt_len)
                for i in range(num_reqs)]
        try:
            _prefill(execute, sample, reqs, BlockAllocator(len(block_sizes)), block_sizes,
                     [mixed[i % len(mixed)] for i in range(num_reqs)], is_pooling=False)
            tokens += num_reqs * prompt_len
            tracker.step()
        finally:
            finish(execute, [r.req_id for r in reqs])
    return _phase(SAMPLER, t[0], num_reqs, tokens, tracker.steps_done, shapes,
                  "greedy, stochastic (temperature/top-k/top-p) and seeded batches, then all "
                  "three mixed")
