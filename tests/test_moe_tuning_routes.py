"""The routes a fused MoE autotune times each candidate over (runner.moe_tuning.route_sets):
calls whose rows name distinct experts and that together read every expert about once, so
the graph's calls stream their weights from memory as a decode step's layers do (the timing
itself needs CUDA: tests/gpu/test_moe_gpu.py warms a model that autotunes every bucket)."""

from __future__ import annotations

import pytest
import torch

from warmgate.server.runner.moe_tuning import MAX_ROUTES, route_sets


@pytest.mark.parametrize(("num_experts", "top_k", "num_tokens", "calls"), [
    (128, 8, 1, 16),  # Qwen3-30B-A3B at a batch-1 decode: every expert once
    (128, 8, 2, 8),
    (8, 2, 1, 4),  # Mixtral
    (60, 8, 1, 8),  # experts no multiple of a call's rows: the last call wraps around
    (128, 8, 32, 1),  # one call's rows reach every expert already
    (512, 2, 1, MAX_ROUTES),  # capped
])
def test_the_calls_read_every_expert_about_once(num_experts: int, top_k: int,
                                                 num_tokens: int, calls: int) -> None:
    routes = route_sets(num_experts, top_k, num_tokens, torch.device("cpu"),
                        torch.Generator().manual_seed(0))
    assert len(routes) == calls
    ids = torch.cat(routes)  # [calls * num_tokens, top_k]
    assert all(r.shape == (num_tokens, top_k) and r.dtype == torch.int64 for r in routes)
    assert ids.min() >= 0 and ids.max() < num_experts
    assert all(len(set(row.tolist())) == top_k for row in ids)  # a token's experts distinct
    counts = torch.bincount(ids.flatten(), minlength=num_experts)
    if calls * num_tokens * top_k >= num_experts:
        assert counts.min() >= 1  # every expert read
    assert counts.max() - counts.min() <= max(1, calls * num_tokens * top_k // num_experts)
