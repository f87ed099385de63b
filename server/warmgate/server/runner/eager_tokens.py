"""The token counts a forward runs at outside a captured CUDA graph, and the granule that eager
batches pad to.

cuBLAS chooses an algorithm at every new GEMM shape, also where it picks a kernel an earlier
shape ran (bench/warm.py kernel-map-touch), so every token count a forward can run at after ready
must be swept before it (warmup/gemm_shapes.py). Two things keep that set small. On CUDA an
eager forward that is not a uniform decode runs at its count rounded up to a multiple of
EAGER_TOKEN_GRANULE, with padding tokens that no request owns (InputBatch.padded): 1/16 of the
counts, for at most 15 rows of row-wise work. And a batch that a captured graph holds runs at
the graph's shapes, chosen at capture.
"""

from __future__ import annotations

from typing import Protocol

import torch

from warmgate.server.config.runner_config import RunnerConfig
from warmgate.server.runner.attention.base import AttentionBackend
from warmgate.server.runner.compile_buckets import ragged_buckets
from warmgate.server.runner.cuda_graphs import capturable_sizes

EAGER_TOKEN_GRANULE = 16


class TokenSettings(Protocol):
    """What these functions read off a runner: RunnerSettings has it all. A protocol, so that
    runner_settings.py imports this module and not the other way round."""

    config: RunnerConfig
    device: torch.device
    decode_query_len: int
    max_num_reqs: int
    max_num_tokens: int
    is_pooling_model: bool
    attention_backend_class: type[AttentionBackend]
    compile_buckets: tuple[int, ...]

    def eager_tokens(self, num_tokens: int) -> int: ...

    def ragged_graph_buckets(self) -> tuple[int, ...]: ...


def round_up(num_tokens: int, granule: int, budget: int) -> int:
    """num_tokens rounded up to a multiple of granule, at most the token budget."""
    return min(-(-num_tokens // granule) * granule, budget)


def eager_token_counts(runner: TokenSettings) -> list[int]:
    """Every token count the runner's forward can run at outside a captured graph once warmup
    is done (ModelRunner._run_model). With torch.compile every forward pads to a bucket.
    Otherwise a uniform decode runs at its own count when no graph holds it, and any other
    batch at eager_tokens of its count unless a ragged graph holds every batch."""
    if runner.compile_buckets:
        return list(runner.compile_buckets)
    q, budget = runner.decode_query_len, runner.max_num_tokens
    padded = {runner.eager_tokens(n) for n in range(1, budget + 1)}
    decodes = [n * q for n in range(1, runner.max_num_reqs + 1) if n * q <= budget]
    cfg = runner.config.compilation
    if runner.device.type != "cuda" or runner.is_pooling_model or not cfg.enable_cuda_graphs:
        return sorted(padded.union(decodes))  # no graphs (the cuda_graphs phase skips)
    sizes = capturable_sizes(cfg.cuda_graph_sizes or (), runner.max_num_reqs, q, budget)
    if not sizes:
        return sorted(padded.union(decodes))
    misses = [t for t in decodes if t > sizes[-1] * q]
    ragged = runner.ragged_graph_buckets()
    if not ragged or max(ragged) < budget:
        return sorted(padded.union(misses))
    return misses


def ragged_graph_buckets(runner: TokenSettings) -> tuple[int, ...]:
    """Token buckets to capture ragged-batch graphs for: torch.compile's (so a replayed
    compiled forward never pads twice), else compile_buckets.ragged_buckets, fine up to the
    largest step beside decodes; or none when the configuration or the backend rules them
    out. Asked before the backend exists too (the runner's on_model_built, for the dense-GEMM
    sweep's token counts): then the backend's class answers."""
    backend = getattr(runner, "attention_backend", runner.attention_backend_class)
    cfg = runner.config.compilation
    if not cfg.ragged_cuda_graphs or runner.is_pooling_model or not backend.supports_ragged_graphs:
        return ()
    if runner.compile_buckets:
        return runner.compile_buckets
    q, budget = runner.decode_query_len, runner.max_num_tokens
    # A step beside decodes holds at most the prompt bound and every request's decode tokens
    # (serving/scheduler.py); without a bound, anything up to the budget.
    bound = runner.config.scheduler.max_prefill_tokens_while_decoding
    mixed = budget if not bound else bound + runner.max_num_reqs * q
    return ragged_buckets(cfg.cuda_graph_sizes or (), q, budget, mixed)
