"""Run every dense GEMM the model can issue, at every token count a step can have, once.

A GEMM at a problem shape cuBLAS has not seen makes it pick an algorithm first (heuristics,
then a cached plan per shape): nothing compiles, so the JIT observers see nothing, but the
first batch with a new token count pays it on each distinct weight shape. The four projections
of a decoder layer repeat in every layer, so one sweep over M = 1..max_num_batched_tokens per
distinct weight (and M = 1..max logits rows for the vocabulary head) covers every layer. On
CUDA only: the CPU's GEMMs keep no per-shape state.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from warmgate.server.core.progress import PhaseProgress


def layer_weights(model: Any) -> list[torch.Tensor]:
    """One weight per distinct (shape, dtype) of the decoder layers' projections."""
    seen: dict[tuple[tuple[int, ...], torch.dtype], torch.Tensor] = {}
    for layer in model.layers:
        for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
            w = getattr(layer, name)
            seen.setdefault((tuple(w.shape), w.dtype), w)
    return list(seen.values())


def gemm_plan(model_runner: Any) -> list[tuple[torch.Tensor, int]]:
    """[(weight, largest M)]: layer projections up to the token budget, the vocabulary head
    up to the most logits rows a step can ask for (every request's 1 + k query rows)."""
    model = model_runner.model
    plan = [(w, int(model_runner.max_num_tokens)) for w in layer_weights(model)]
    if not model_runner.is_pooling_model:
        head = model.embed_tokens if model.lm_head is None else model.lm_head
        rows = min(model_runner.max_num_tokens,
                   model_runner.max_num_reqs * model_runner.decode_query_len)
        plan.append((head, int(rows)))
    return plan


@torch.inference_mode()
def sweep_gemm_shapes(model_runner: Any, tracker: PhaseProgress | None = None) -> int:
    """Every (weight, M) of gemm_plan once; returns the number of GEMMs run."""
    count = 0
    for weight, max_m in gemm_plan(model_runner):
        x = torch.zeros(max_m, weight.shape[1], device=weight.device, dtype=weight.dtype)
        for m in range(1, max_m + 1):
            F.linear(x[:m], weight)
        count += max_m
        if tracker is not None:
            tracker.step()
    return count
