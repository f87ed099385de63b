"""How requests are batched: the KV cache's blocks, the scheduler's per-step limits and the
speculative drafts per decode step (parts of RunnerConfig, which re-exports them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from warmgate.server.config import flag_values
from warmgate.server.config.config_error import _require
from warmgate.server.config.flags import flag


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = field(default=16, metadata=flag("--block-size",
                                                      "tokens per KV cache block"))
    # None means auto; block 0 is the null block.
    num_blocks: int | None = field(default=None, metadata=flag(
        "--num-blocks", "KV cache blocks (default: enough for max-num-seqs full-length "
        "requests)"))

    def __post_init__(self) -> None:
        _require(self.block_size >= 1, "cache.block_size", "must be >= 1")
        _require(self.num_blocks is None or self.num_blocks >= 1, "cache.num_blocks",
                 "must be >= 1 (block 0 is reserved as the null block)")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = field(default=8, metadata=flag("--max-num-seqs", "requests per batch"))
    max_num_batched_tokens: int = field(default=256, metadata=flag(
        "--max-num-batched-tokens", "tokens per batch"))
    # A running stream's next token waits for its step, prompt chunks included: 128 streams
    # arriving together made the 8B's ITL p99 17x its median as 8k-token steps of prompts
    # ran between decodes. About a thousand prompt tokens cost an 8B a few decode steps.
    max_prefill_tokens_while_decoding: int = field(default=1024, metadata=flag(
        "--max-prefill-tokens-while-decoding",
        "prompt tokens a step takes at most while running requests decode in it (a bound on "
        "their inter-token latency); 0: the whole --max-num-batched-tokens",
        parse=flag_values.non_negative))

    def __post_init__(self) -> None:
        _require(self.max_num_seqs >= 1, "scheduler.max_num_seqs", "must be >= 1")
        _require(self.max_num_batched_tokens >= 1, "scheduler.max_num_batched_tokens",
                 "must be >= 1")
        _require(self.max_prefill_tokens_while_decoding >= 0,
                 "scheduler.max_prefill_tokens_while_decoding", "must be >= 0")


@dataclass(frozen=True)
class SpeculativeConfig:
    num_speculative_steps: int = field(default=0, metadata=flag(
        "--num-speculative-steps", "draft tokens per decode step",
        parse=flag_values.non_negative))

    def __post_init__(self) -> None:
        _require(0 <= self.num_speculative_steps <= 64, "speculative.num_speculative_steps",
                 "must be between 0 and 64")
