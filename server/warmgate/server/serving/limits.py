"""The scheduler's limits, read once from a resolved runner config."""

from __future__ import annotations

from dataclasses import dataclass

from warmgate.server.config.runner_config import RunnerConfig


@dataclass(frozen=True)
class SchedulerLimits:
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    num_blocks: int
    max_model_len: int
    num_speculative_steps: int = 0
    # Prompt tokens a step takes at most while requests decode in it; 0: no bound but the
    # token budget (SchedulerConfig.max_prefill_tokens_while_decoding).
    max_prefill_tokens_while_decoding: int = 0
    # Overlapped scheduling (serving/overlap.py): the serving config's, not the runner's.
    async_scheduling: bool = False

    @classmethod
    def of_config(cls, config: RunnerConfig, *, async_scheduling: bool = False
                  ) -> SchedulerLimits:
        """The limits of a resolved config (a runner's `config`, or the server's before
        any runner exists); async_scheduling comes from the serving config."""
        if config.cache.num_blocks is None:
            raise ValueError("SchedulerLimits need a resolved config (cache.num_blocks set)")
        return cls(max_num_seqs=config.scheduler.max_num_seqs,
                   max_num_batched_tokens=config.scheduler.max_num_batched_tokens,
                   block_size=config.cache.block_size, num_blocks=config.cache.num_blocks,
                   max_model_len=config.model.max_model_len,
                   num_speculative_steps=config.speculative.num_speculative_steps,
                   max_prefill_tokens_while_decoding=(
                       config.scheduler.max_prefill_tokens_while_decoding),
                   async_scheduling=async_scheduling)

    @property
    def max_tokens_in_cache(self) -> int:
        return (self.num_blocks - 1) * self.block_size
