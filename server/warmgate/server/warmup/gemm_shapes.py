"""Run every dense GEMM the model can issue outside a CUDA graph after ready, once, at every
token count it can have there.

A GEMM at a problem shape cuBLAS has not seen makes it choose an algorithm first (heuristics,
then a cached plan per shape): nothing compiles, so the JIT observers see nothing, but the
first batch with a new token count pays it on each distinct weight shape. Every new shape pays,
also one that picks a kernel an earlier size already ran (bench/warm.py kernel-map-touch measures
it; bench/results/README.md holds the figures). So no size can be skipped, and no kernel map
is kept for GEMMs; what shrinks the sweep is running only the token counts a forward can have
outside a captured graph (runner/eager_tokens.py: padded eager batches, graphs), since a graph
replay chooses nothing. The four
projections of a decoder layer repeat in every layer, so one sweep per distinct weight covers
every layer; the vocabulary head runs eagerly on every step, at 1..max logits rows. On CUDA
only: the CPU's GEMMs keep no per-shape state. Each GEMM is the model's own (its ops'
`linear`): under --deterministic the batch-invariant Triton matmul, which compiles here, once
per weight shape and row tile (the row count is not a specialisation, but an unsplit weight's
launches of 128 tokens or more take taller row tiles: a second binary, compiled here at those
counts, or by the eager run before a CUDA graph's capture where a graph holds them), instead
of cuBLAS choosing; a weight it splits along K also launches the
split-summing kernel at the small token counts, so that compiles here too
(kernels/matmul_plan.py). Where the Triton GEMV may run a linear of a few
rows (kernels/dense_gemv.py), its binaries compile here too, one per weight shape and row
bucket, for the cuda_graphs phase to time it against cuBLAS (runner/linear_tuning.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from warmgate.server.core.progress import PhaseProgress
from warmgate.server.runner.linear_tuning import compile_gemvs
from warmgate.server.warmup.fp8_gemms import sweep_fp8_gemms
from warmgate.server.warmup.runner_contract import WarmupRunner
from warmgate.server.warmup.size_sweeps import SizeSweep

logger = logging.getLogger(__name__)

# [(weight, the Ms it runs at, ascending)], as gemm_plan gives it.
GemmPlan = list[tuple[torch.Tensor, list[int]]]


def layer_weights(model: Any) -> list[torch.Tensor]:
    """One weight per distinct (shape, dtype) of the decoder layers' projections (a MoE
    layer's router; its experts run a grouped Triton kernel, not cuBLAS)."""
    seen: dict[tuple[tuple[int, ...], torch.dtype], torch.Tensor] = {}
    for layer in model.layers:
        moe = getattr(layer, "moe", None)
        weights = [getattr(layer, n) for n in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")]
        for w in [*weights, None if moe is None else moe.router]:
            # FP8 projections are not F.linear: warmup/fp8_gemms.py sweeps them.
            if w is not None and w.dtype != torch.float8_e4m3fn:
                seen.setdefault((tuple(w.shape), w.dtype), w)
    return list(seen.values())


def gemm_plan(model_runner: WarmupRunner) -> GemmPlan:
    """[(weight, its Ms, ascending)]: layer projections at the token counts a forward can run
    outside a graph, the vocabulary head at 1..the most logits rows a step can ask for (every
    request's 1 + k query rows; prompt logprobs take at most max_num_reqs rows at a time)."""
    model = model_runner.model
    counts = model_runner.eager_token_counts()
    plan = [(w, counts) for w in layer_weights(model)] if counts else []
    if not model_runner.is_pooling_model:
        head = model.embed_tokens if model.lm_head is None else model.lm_head
        rows = min(model_runner.max_num_tokens,
                   model_runner.max_num_reqs * model_runner.decode_query_len)
        plan.append((head, list(range(1, rows + 1))))
    return plan


def gemm_key(weight: torch.Tensor, max_m: int) -> str:
    """A sweep's name: the weight's shape and dtype, and the Ms."""
    n, k = weight.shape
    return f"{n}x{k}:{str(weight.dtype).removeprefix('torch.')}:m1..{max_m}"


def gemm_sweep(weight: torch.Tensor, max_m: int,
               linear: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.linear,
               ) -> SizeSweep:
    """linear (the model's) of `weight` at M = 1..max_m tokens, on one zero input sliced to
    M. The input exists from the sweep's first call to its call at max_m (every run of a
    sweep ends there): the plan's sweeps are built at once, and inputs held for all of them
    would add up."""
    held: list[torch.Tensor] = []

    def call(m: int) -> torch.Tensor:
        if not held:
            held.append(torch.zeros(max_m, weight.shape[1], device=weight.device,
                                    dtype=weight.dtype))
        out = linear(held[0][:m], weight)
        if m == max_m:
            held.clear()
        return out
    return SizeSweep(gemm_key(weight, max_m), max_m, call, weight.device)


@torch.inference_mode()
def sweep_gemm_shapes(model_runner: WarmupRunner, tracker: PhaseProgress | None = None, *,
                      plan: GemmPlan | None = None,
                      where: str = "") -> int:
    """Every (weight, M) of `plan` (default: gemm_plan's) once. Returns the GEMMs run; `where`
    says, in the log line, where it ran when not on the phase's own thread."""
    start = time.perf_counter()
    plan = gemm_plan(model_runner) if plan is None else plan
    count = 0
    for weight, ms in plan:
        if ms:
            call = gemm_sweep(weight, ms[-1], model_runner.model.ops.linear).call
            for m in ms:
                call(m)
            count += len(ms)
        if tracker is not None:
            tracker.step()
    count += sweep_fp8_gemms(model_runner)
    gemv_start = time.perf_counter()
    if gemvs := compile_gemvs(model_runner):  # compiled here, timed before the CUDA graphs
        logger.info("shape sweeps: Triton GEMV: %d (shape, row bucket) compiled and run in "
                    "%.3f s%s", gemvs, time.perf_counter() - gemv_start,
                    f" ({where})" if where else "")
    logger.info("shape sweeps: dense GEMMs: %d in %.3f s%s, Ms per weight %s (layer weights "
                "at the token counts a forward can run outside a CUDA graph, the head at every "
                "logits row count)", count, time.perf_counter() - start,
                f" ({where})" if where else "", [len(ms) for _, ms in plan])
    return count
