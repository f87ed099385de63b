"""The kernel warmup's shapes and the KV cache, token budget and sequence length it needs.

Plain numbers in, plain numbers out (no runner, no torch), so the start-up check
(`check_config_capacity`) and the warmup itself (`warmup_kernels`) decide from one formula.

vLLM's Model Runner V2 (PR 40746) sizes every warmup request for its prefill and one decode:
prompt_len = 2 + num_spec_steps, decode_len = prompt_len + decode_query_len, and
num_reqs = min(max_num_seqs, max_num_batched_tokens // max(prompt_len, decode_query_len),
max(1, (num_blocks - 1) // blocks_per_req)). warmgate's extra decode steps (two requests side
by side, then one alone) fit into those same blocks: a request whose next step would run past
the tokens its blocks hold (or past max_model_len) is restated back to prompt_len computed
tokens, as a scheduler restates a request whose drafts were rejected, and reuses its blocks.
"""

from __future__ import annotations

from collections.abc import Sequence

from warmgate.server.config.runner_config import ConfigError, RunnerConfig, cdiv
from warmgate.server.core.results import SkipReason

# vLLM's mixed FlashInfer attention warmup uses 16 tokens.
DEFAULT_MIXED_NUM_TOKENS = 16
# The mixed step's decoding request: a 2-token prompt, then one decode token.
MIXED_DECODE_PROMPT_LEN = 2
# A skip for one of these means the configuration lacks what serving's own paths need.
RESOURCE_SKIPS = (SkipReason.INSUFFICIENT_KV_BLOCKS, SkipReason.TOKEN_BUDGET_TOO_SMALL,
                  SkipReason.MAX_MODEL_LEN_TOO_SMALL)


def blocks_for(num_tokens: int, block_sizes: Sequence[int]) -> list[int]:
    """Blocks each KV cache group needs to hold num_tokens."""
    return [cdiv(num_tokens, bs) for bs in block_sizes]


def kernel_shapes(*, num_spec_steps: int, block_sizes: Sequence[int], num_blocks: int,
                  max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int
                  ) -> dict[str, int]:
    """prompt_len, decode_query_len, num_reqs (the seed's formula), its caps, and what each
    request holds: max_blocks_per_req blocks, tokens_per_req tokens at most."""
    decode_query_len = 1 + num_spec_steps
    prompt_len = 2 + num_spec_steps
    decode_len = prompt_len + decode_query_len
    per_group = blocks_for(decode_len, block_sizes)
    max_blocks_per_req = sum(per_group)
    tokens_per_req = min([max_model_len] + [n * bs for n, bs in zip(per_group, block_sizes,
                                                                    strict=True)])
    cap_tokens = max_num_batched_tokens // max(prompt_len, decode_query_len)
    cap_blocks = max(1, (num_blocks - 1) // max_blocks_per_req)
    num_reqs = min(max_num_seqs, cap_tokens, cap_blocks)
    return dict(prompt_len=prompt_len, decode_query_len=decode_query_len, decode_len=decode_len,
                num_reqs=num_reqs, extra_steps_num_reqs=min(num_reqs, 2),
                cap_max_num_seqs=max_num_seqs, cap_max_num_batched_tokens=cap_tokens,
                cap_kv_blocks=cap_blocks, max_blocks_per_req=max_blocks_per_req,
                tokens_per_req=tokens_per_req, num_blocks=num_blocks,
                max_model_len=max_model_len)


def kernel_shortfall(shapes: dict[str, int], max_num_batched_tokens: int
                     ) -> tuple[SkipReason, str, str] | None:
    """(reason, flag to raise, sentence) when not even one warmup request fits; else None.

    The seed keeps a floor of one request (max(1, ...)); below that the runner cannot hold
    the prefill and decode every request starts with, so serving could never run them.
    """
    if shapes["cap_max_num_batched_tokens"] < 1:
        return (SkipReason.TOKEN_BUDGET_TOO_SMALL, "--max-num-batched-tokens",
                f"max_num_batched_tokens ({max_num_batched_tokens}) is below one warmup prompt "
                f"({shapes['prompt_len']} tokens); raise --max-num-batched-tokens to at least "
                f"{shapes['prompt_len']}")
    if shapes["decode_len"] > shapes["max_model_len"]:
        return (SkipReason.MAX_MODEL_LEN_TOO_SMALL, "--max-model-len",
                f"max_model_len ({shapes['max_model_len']}) is below one warmup request "
                f"({shapes['prompt_len']} prompt tokens and a decode of "
                f"{shapes['decode_query_len']}); raise --max-model-len to at least "
                f"{shapes['decode_len']} or lower --num-speculative-steps")
    available = shapes["num_blocks"] - 1
    if available < shapes["max_blocks_per_req"]:
        return (SkipReason.INSUFFICIENT_KV_BLOCKS, "--num-blocks",
                f"one warmup request needs {shapes['max_blocks_per_req']} KV blocks but only "
                f"{available} exist besides the null block; raise --num-blocks to at least "
                f"{shapes['max_blocks_per_req'] + 1}")
    return None


def default_mixed_num_tokens(max_num_batched_tokens: int, max_model_len: int) -> int:
    """The mixed step's size when none is given: 16, or less when the token budget or the
    prefill's max_model_len cannot hold 16."""
    return min(DEFAULT_MIXED_NUM_TOKENS, max_num_batched_tokens, max_model_len + 1)


def mixed_blocks_needed(num_tokens: int, block_sizes: Sequence[int]) -> int:
    """KV blocks the mixed step holds: the decoding request's 3 tokens and the prefill's."""
    return (sum(blocks_for(MIXED_DECODE_PROMPT_LEN + 1, block_sizes))
            + sum(blocks_for(num_tokens - 1, block_sizes)))


def check_config_capacity(config: RunnerConfig, mixed_num_tokens: int | None) -> None:
    """Start-up: ConfigError, naming the flag to raise, when the warmup plan could never
    succeed on this configuration (a resolved one: num_blocks is known)."""
    if config.cache.num_blocks is None:
        return  # sized at load from max_num_seqs * max_blocks_per_req, which always fits
    block_sizes = [config.cache.block_size]
    sched, max_model_len = config.scheduler, config.model.max_model_len
    shapes = kernel_shapes(num_spec_steps=config.speculative.num_speculative_steps,
                           block_sizes=block_sizes, num_blocks=config.cache.num_blocks,
                           max_num_seqs=sched.max_num_seqs,
                           max_num_batched_tokens=sched.max_num_batched_tokens,
                           max_model_len=max_model_len)
    short = kernel_shortfall(shapes, sched.max_num_batched_tokens)
    if short is not None:
        field = {"--max-num-batched-tokens": "scheduler.max_num_batched_tokens",
                 "--max-model-len": "model.max_model_len"}.get(short[1], "cache.num_blocks")
        raise ConfigError(field, short[2])
    num_tokens = (default_mixed_num_tokens(sched.max_num_batched_tokens, max_model_len)
                  if mixed_num_tokens is None else mixed_num_tokens)
    if config.model.is_pooling_model or sched.max_num_seqs < 2 or num_tokens < 3:
        return  # the mixed phase skips for a reason that is not a shortfall
    if num_tokens - 1 > max_model_len:
        raise ConfigError("--mixed-num-tokens",
                          f"the mixed step's prefill ({num_tokens - 1} tokens) is longer than "
                          f"--max-model-len ({max_model_len}); lower --mixed-num-tokens to at "
                          f"most {max_model_len + 1}")
    needed = mixed_blocks_needed(num_tokens, block_sizes)
    if needed > config.cache.num_blocks - 1:
        raise ConfigError("cache.num_blocks",
                          f"the mixed warmup step ({num_tokens} tokens) needs {needed} KV "
                          f"blocks but only {config.cache.num_blocks - 1} exist besides the "
                          f"null block; raise --num-blocks to at least {needed + 1} or lower "
                          "--mixed-num-tokens")
