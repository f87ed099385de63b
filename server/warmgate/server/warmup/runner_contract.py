"""The runner as warmup sees it: the attributes and the two callbacks the plan drives.

This is the MRV2 model-runner contract (the shape vLLM's GPU model runner offers its
worker): limits and configs to size the warmup batches from, `execute_model` (one forward
over a scheduled step) and `sample_tokens` (sample the step just executed). Warmup code is
written against this protocol, not against ModelRunner, so a test can hand it a stand-in
and the dependency runs one way (warmup -> runner's types, never the runner's module).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the torch-heavy runner types, for the checker only
    import torch

    from warmgate.server.config.runner_config import RunnerConfig, SchedulerConfig
    from warmgate.server.jit import JitMonitor
    from warmgate.server.runner.attention.base import AttentionBackend
    from warmgate.server.runner.kv_cache import KVCacheConfig
    from warmgate.server.runner.loading import LoadStats
    from warmgate.server.runner.model import LlamaModel
    from warmgate.server.runner.sampling import Sampler
    from warmgate.server.runner.scheduler_output import (
        GrammarOutput,
        ModelRunnerOutput,
        SchedulerOutput,
    )


class WarmupRunner(Protocol):
    config: RunnerConfig
    scheduler_config: SchedulerConfig
    device: torch.device
    model: LlamaModel
    sampler: Sampler
    attention_backend: AttentionBackend
    kv_cache_config: KVCacheConfig
    jit_monitor: JitMonitor
    load_stats: LoadStats
    max_num_reqs: int
    max_num_tokens: int
    max_model_len: int
    decode_query_len: int
    num_speculative_steps: int
    is_pooling_model: bool
    # The batch sizes torch.compile specialises for (empty: compile is off).
    compile_buckets: tuple[int, ...]

    @property
    def cuda_graphs_captured(self) -> bool: ...

    def capture_cuda_graphs(self) -> dict[str, object]: ...

    def choose_linears(self) -> dict[str, object]:
        """Decide the kernel of every dense linear of a few rows ({} when there is no choice
        to make)."""

    def eager_token_counts(self) -> list[int]:
        """The token counts a forward can run at outside a captured graph after warmup."""

    def ragged_graph_buckets(self) -> tuple[int, ...]:
        """The token buckets ragged-batch graphs are captured for."""

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput | None:
        """One forward over a scheduled step (a step that only frees requests runs none)."""

    def sample_tokens(self, grammar_output: GrammarOutput | None) -> ModelRunnerOutput | None:
        """Sample the step execute_model just ran."""
