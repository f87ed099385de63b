"""What a ModelRunner's configuration says, under vLLM MRV2's attribute names: readable before
the model exists, so the warmup can plan its dense-GEMM sweep from the model's construction on
(the runner's on_model_built)."""

from __future__ import annotations

import torch

from warmgate.server.config.runner_config import RunnerConfig
from warmgate.server.runner.attention import get_backend_class
from warmgate.server.runner.compile_buckets import compile_buckets
from warmgate.server.runner.default_ops import configure_pdl
from warmgate.server.runner.eager_tokens import (
    EAGER_TOKEN_GRANULE,
    eager_token_counts,
    ragged_graph_buckets,
    round_up,
)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class RunnerSettings:
    """The configuration-derived half of ModelRunner: set by _read_config, first thing."""

    def _read_config(self, config: RunnerConfig) -> None:
        """The settings other code reads off the runner, under vLLM MRV2's attribute names."""
        self.config = config
        configure_pdl(config)  # before anything launches a Triton kernel
        self.device = torch.device(config.device.device)
        self.dtype = _DTYPES[config.device.dtype]
        self.scheduler_config = config.scheduler
        self.num_speculative_steps = config.speculative.num_speculative_steps
        self.decode_query_len = config.decode_query_len
        self.max_num_reqs = config.scheduler.max_num_seqs
        self.max_num_tokens = config.scheduler.max_num_batched_tokens
        self.max_model_len = config.model.max_model_len
        self.is_pooling_model = config.model.is_pooling_model
        # The backend's class, for what it supports before it exists (ragged graphs).
        self.attention_backend_class = get_backend_class(config.device.attention_backend)
        # What eager_tokens rounds to: the CPU's GEMMs keep no per-shape state, and a compiled
        # forward pads to its own buckets.
        self.eager_granule = (EAGER_TOKEN_GRANULE if self.device.type == "cuda"
                              and not config.compilation.compile else 1)
        # torch.compile's token buckets (none with it off); _choose_forward wraps the model.
        self.compile_buckets: tuple[int, ...] = (
            compile_buckets(config.compilation.cuda_graph_sizes or (), self.decode_query_len,
                            self.max_num_tokens) if config.compilation.compile else ())

    def eager_tokens(self, num_tokens: int) -> int:
        """The token count an eager forward of num_tokens that is not a uniform decode runs
        at (eager_tokens.py)."""
        return round_up(num_tokens, self.eager_granule, self.max_num_tokens)

    def ragged_graph_buckets(self) -> tuple[int, ...]:
        """Token buckets to capture ragged-batch graphs for (eager_tokens.py)."""
        return ragged_graph_buckets(self)

    def eager_token_counts(self) -> list[int]:
        """The token counts a forward can run at outside a captured graph once warmup is done:
        what the dense GEMM sweep must cover (eager_tokens.py)."""
        return eager_token_counts(self)
