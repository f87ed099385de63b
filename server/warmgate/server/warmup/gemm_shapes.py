"""Run every dense GEMM the model can issue, at every token count a step can have, once.

A GEMM at a problem shape cuBLAS has not seen makes it pick an algorithm first (heuristics,
then a cached plan per shape): nothing compiles, so the JIT observers see nothing, but the
first batch with a new token count pays it on each distinct weight shape. The four projections
of a decoder layer repeat in every layer, so one sweep over M = 1..max_num_batched_tokens per
distinct weight (and M = 1..max logits rows for the vocabulary head) covers every layer. On
CUDA only: the CPU's GEMMs keep no per-shape state.

With a compile cache, only the token counts that launch every kernel run after the first
start (size_sweeps.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from warmgate.server.cache.shape_sweeps import GEMM_FILE
from warmgate.server.core.progress import PhaseProgress
from warmgate.server.warmup.runner_contract import WarmupRunner
from warmgate.server.warmup.size_sweeps import KernelProbe, SizeSweep, run_size_sweeps


def layer_weights(model: Any) -> list[torch.Tensor]:
    """One weight per distinct (shape, dtype) of the decoder layers' projections."""
    seen: dict[tuple[tuple[int, ...], torch.dtype], torch.Tensor] = {}
    for layer in model.layers:
        for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
            w = getattr(layer, name)
            seen.setdefault((tuple(w.shape), w.dtype), w)
    return list(seen.values())


def gemm_plan(model_runner: WarmupRunner) -> list[tuple[torch.Tensor, int]]:
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


def gemm_key(weight: torch.Tensor, max_m: int) -> str:
    """The kernel map's name for one sweep: the weight's shape and dtype, and the Ms."""
    n, k = weight.shape
    return f"{n}x{k}:{str(weight.dtype).removeprefix('torch.')}:m1..{max_m}"


def gemm_sweep(weight: torch.Tensor, max_m: int) -> SizeSweep:
    """F.linear of `weight` at M = 1..max_m tokens, on one zero input sliced to M. The input
    exists from the sweep's first call to its call at max_m (every run of a sweep ends there):
    the plan's sweeps are built at once, and inputs held for all of them would add up."""
    held: list[torch.Tensor] = []

    def call(m: int) -> torch.Tensor:
        if not held:
            held.append(torch.zeros(max_m, weight.shape[1], device=weight.device,
                                    dtype=weight.dtype))
        out = F.linear(held[0][:m], weight)
        if m == max_m:
            held.clear()
        return out
    return SizeSweep(gemm_key(weight, max_m), max_m, call, weight.device)


@torch.inference_mode()
def sweep_gemm_shapes(model_runner: WarmupRunner, tracker: PhaseProgress | None = None, *,
                      kernel_dir: Path | None = None, probe: KernelProbe | None = None) -> int:
    """Every (weight, M) of gemm_plan once, or, with a kernel map in kernel_dir, only the Ms
    that launch every kernel (size_sweeps.run_size_sweeps). Returns the GEMMs run."""
    return run_size_sweeps([gemm_sweep(w, m) for w, m in gemm_plan(model_runner)],
                           what="dense GEMMs", file_name=GEMM_FILE, kernel_dir=kernel_dir,
                           probe=probe, tracker=tracker)
