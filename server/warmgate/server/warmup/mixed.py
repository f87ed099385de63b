"""`run_mixed_prefill_decode_warmup`: one step with a decode and a prefill side by side.

vLLM's semantics (seed 2, vLLM PR 47050): the gates come first and touch nothing, not even
the KV cache config, so a skipped warmup calls neither callback. Otherwise prefill a 2-token
request, then run one mixed step: that request decoding one token plus a new prefill of
num_tokens - 1 tokens, optionally inside `mixed_step_context` (an autotune context, say).
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager, nullcontext

from warmgate.server.core.phases import MIXED
from warmgate.server.core.progress import PhaseProgress, ProgressCallback
from warmgate.server.core.results import PhaseResult, PhaseStatus, SkipReason, WarmupResult
from warmgate.server.runner.scheduler_output import GREEDY
from warmgate.server.warmup.runner_contract import WarmupRunner
from warmgate.server.warmup.shapes import MIXED_DECODE_PROMPT_LEN, mixed_blocks_needed
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

logger = logging.getLogger(__name__)

# The decoding request's prompt: two tokens, so its next step is a one-token decode.
DECODE_PROMPT_LEN = MIXED_DECODE_PROMPT_LEN


def _gate(model_runner: WarmupRunner, num_tokens: int) -> WarmupResult | None:
    """The cheap preconditions, in vLLM's order; reads nothing beyond what each needs."""
    if model_runner.is_pooling_model:
        return WarmupResult.skipped(MIXED, SkipReason.POOLING_MODEL,
                                    "a pooling model never decodes, so there is no mixed step")
    if model_runner.max_num_reqs < 2:
        return WarmupResult.skipped(
            MIXED, SkipReason.MAX_NUM_REQS_LT_2,
            f"a mixed step needs 2 requests but max_num_reqs is {model_runner.max_num_reqs}")
    if num_tokens < 3:
        return WarmupResult.skipped(
            MIXED, SkipReason.NUM_TOKENS_LT_3,
            f"num_tokens is {num_tokens}; a mixed step needs at least 3 (1 decode token and a "
            "prefill of 2 or more)")
    return None


def run_mixed_prefill_decode_warmup(
    model_runner: WarmupRunner,
    worker_execute_model: ExecuteModel,
    worker_sample_tokens: SampleTokens,
    num_tokens: int,
    *,
    mixed_step_context: AbstractContextManager[object] | None = None,
    req_id_prefix: str = "_warmup_mixed",
    progress: ProgressCallback | None = None,
) -> WarmupResult:
    """Truthy iff the mixed step ran; a skip carries its reason and touched nothing."""
    skipped = _gate(model_runner, num_tokens)
    if skipped is None:
        skipped = _check_capacity(model_runner, num_tokens)
    if skipped is not None:
        logger.debug("warmup phase=%s status=SKIPPED reason=%s: %s", MIXED,
                    skipped.skip_reason.value if skipped.skip_reason else "", skipped.detail)
        return skipped

    block_sizes = kv_block_sizes(model_runner)
    alloc = BlockAllocator(len(block_sizes))
    decode_id, prefill_id = f"{req_id_prefix}_decode", f"{req_id_prefix}_prefill"
    prefill_len = num_tokens - 1
    execute, sample = worker_execute_model, worker_sample_tokens
    tracker = PhaseProgress(MIXED, 2, progress)
    try:
        with synced_timer(model_runner) as t:
            first = alloc.take(blocks_for(DECODE_PROMPT_LEN, block_sizes))
            run_step(execute, sample, scheduler_output(
                new_reqs=[new_request(decode_id, list(range(DECODE_PROMPT_LEN)), first, GREEDY)],
                num_scheduled={decode_id: DECODE_PROMPT_LEN}))
            tracker.step()
            need = blocks_for(DECODE_PROMPT_LEN + 1, block_sizes)
            delta = [n - len(b) for n, b in zip(need, first, strict=True)]
            grow = alloc.take(delta) if any(delta) else None
            second = new_request(prefill_id, list(range(prefill_len)),
                                 alloc.take(blocks_for(prefill_len, block_sizes)), GREEDY)
            so = scheduler_output(new_reqs=[second],
                                  cached=[(decode_id, DECODE_PROMPT_LEN, grow)],
                                  num_scheduled={decode_id: 1, prefill_id: prefill_len})
            with mixed_step_context if mixed_step_context is not None else nullcontext():
                run_step(execute, sample, so)
            tracker.step()
    finally:
        finish(execute, [decode_id, prefill_id])
    logger.debug("warmup phase=%s status=RAN seconds=%.3f num_tokens=%d (1 decode + %d prefill)",
                MIXED, t[0], num_tokens, prefill_len)
    phase = PhaseResult(name=MIXED, status=PhaseStatus.RAN, duration_s=t[0], num_reqs=2,
                        num_tokens=num_tokens, num_steps=2,
                        shapes=dict(decode_tokens=1, prefill_tokens=prefill_len),
                        detail=f"1 decode token beside a {prefill_len}-token prefill")
    return WarmupResult(ran=True, phases=[phase])


def _check_capacity(model_runner: WarmupRunner, num_tokens: int) -> WarmupResult | None:
    """Budget checks that need the scheduler and KV cache configs (read only past the gates)."""
    budget = model_runner.scheduler_config.max_num_batched_tokens
    if num_tokens > budget:
        return WarmupResult.skipped(
            MIXED, SkipReason.TOKEN_BUDGET_TOO_SMALL,
            f"num_tokens ({num_tokens}) exceeds max_num_batched_tokens ({budget})")
    max_model_len = model_runner.max_model_len
    if num_tokens - 1 > max_model_len:
        return WarmupResult.skipped(
            MIXED, SkipReason.MAX_MODEL_LEN_TOO_SMALL,
            f"the mixed step's prefill ({num_tokens - 1} tokens) is longer than max_model_len "
            f"({max_model_len}); lower --mixed-num-tokens to at most {max_model_len + 1}")
    block_sizes = kv_block_sizes(model_runner)
    needed = mixed_blocks_needed(num_tokens, block_sizes)
    available = model_runner.kv_cache_config.num_blocks - 1
    if needed > available:
        logger.warning("mixed warmup needs %d KV blocks, only %d available; skipping",
                       needed, available)
        return WarmupResult.skipped(
            MIXED, SkipReason.INSUFFICIENT_KV_BLOCKS,
            f"the mixed step needs {needed} KV blocks but only {available} exist besides the "
            "null block; raise --num-blocks or lower --mixed-num-tokens")
    return None
