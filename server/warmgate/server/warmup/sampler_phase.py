"""The `kernels.sampler` phase: every sampler path once, through the real runner.

Each batch of sampler_paths.sampler_batches is a prefill and its decode steps. The plan runs
this phase after the CUDA graphs (plan.py says why): the forward of its decode steps is then
the captured graph serving replays, and only the sampler, which runs eagerly after the forward
on every step, is new.
"""

from __future__ import annotations

import logging

from warmgate.server.core.phases import SAMPLER
from warmgate.server.core.progress import PhaseProgress, ProgressCallback
from warmgate.server.core.results import PhaseResult, SkipReason
from warmgate.server.warmup.runner_contract import WarmupRunner
from warmgate.server.warmup.sampler_paths import FEATURE_VARIANTS, NOT_APPLICABLE, sampler_batches
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


def warmup_sampler(model_runner: WarmupRunner, execute: ExecuteModel, sample: SampleTokens, *,
                   progress: ProgressCallback | None = None,
                   req_id_prefix: str = "_warmup") -> PhaseResult:
    """Run every sampler batch; SKIPPED for a pooling model (it never samples) or when the
    configuration cannot hold the kernel warmup's requests (the reason kernels.prefill
    gives)."""
    if model_runner.is_pooling_model:
        return PhaseResult.skipped(SAMPLER, SkipReason.POOLING_MODEL, POOLING_NEVER_SAMPLES)
    shapes = warmup_shapes(model_runner)
    skip = shortfall_skip(model_runner, shapes)
    if skip is not None:
        return PhaseResult.skipped(SAMPLER, *skip)
    num_reqs, prompt_len = shapes["num_reqs"], shapes["prompt_len"]
    num_spec = model_runner.num_speculative_steps
    block_sizes = kv_block_sizes(model_runner)
    batches = sampler_batches(num_reqs, num_spec)
    tracker = PhaseProgress(SAMPLER, sum(1 + len(b.decodes) for b in batches), progress)
    tokens = 0
    with synced_timer(model_runner) as t:
        for batch in batches:
            reqs = [WarmupRequest(f"{req_id_prefix}_{batch.name}_{i}", prompt_len)
                    for i in range(num_reqs)]
            alloc = BlockAllocator(len(block_sizes))
            try:
                prefill_step(execute, sample, reqs, alloc, block_sizes, batch.params,
                             is_pooling=False)
                tokens += num_reqs * prompt_len
                tracker.step()
                for with_drafts in batch.decodes:
                    rows = [(i, with_drafts) for i in range(num_reqs)]
                    tokens += decode_step(execute, sample, reqs, rows, num_spec, alloc,
                                          block_sizes, shapes["tokens_per_req"])[0]
                    tracker.step()
            finally:
                finish(execute, [r.req_id for r in reqs])
    names = [b.name for b in batches]
    logger.info("warmup phase=%s sampler paths=%d (%s) num_reqs=%d spec_steps=%d", SAMPLER,
                len(names), ",".join(names), num_reqs, num_spec)
    return ran_phase(SAMPLER, t[0], num_reqs, tokens, tracker.steps_done,
                     {**shapes, "sampler_paths": names, "not_applicable": NOT_APPLICABLE},
                     "greedy, stochastic (temperature/top-k/top-p) and seeded batches, all three "
                     "mixed, then each sampling feature beside plain rows ("
                     + ", ".join(name for name, _ in FEATURE_VARIANTS)
                     + (", decoded with and without drafts" if num_spec else "")
                     + ") and every feature mixed; not applicable: CUDA graphs (the sampler "
                     "runs eagerly, outside the captured forward)")
