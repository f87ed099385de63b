"""Run every dense GEMM the model can issue, at every token count a step can have, once.

A GEMM at a problem shape cuBLAS has not seen makes it pick an algorithm first (heuristics,
then a cached plan per shape): nothing compiles, so the JIT observers see nothing, but the
first batch with a new token count pays it on each distinct weight shape. The four projections
of a decoder layer repeat in every layer, so one sweep over M = 1..max_num_batched_tokens per
distinct weight (and M = 1..max logits rows for the vocabulary head) covers every layer. On
CUDA only: the CPU's GEMMs keep no per-shape state.

The first sweep with a compile cache runs every M and learns which pick distinct kernels
(gemm_kernels.py); the kernel map it leaves in the cache entry lets a warm start run only
those (cache/shape_sweeps.py says when the map is not trusted, and every M runs again).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from warmgate.server.cache.shape_sweeps import KernelMap, load_kernel_map, save_kernel_map
from warmgate.server.core.failures import is_fatal_device_error, is_out_of_memory
from warmgate.server.core.progress import PhaseProgress
from warmgate.server.warmup.gemm_kernels import (
    KernelProbe,
    distinct_sizes,
    kernel_identity,
    profile_kernels,
)
from warmgate.server.warmup.runner_contract import WarmupRunner

logger = logging.getLogger(__name__)


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


def _run(weight: torch.Tensor, sizes: Sequence[int]) -> int:
    x = torch.zeros(max(sizes), weight.shape[1], device=weight.device, dtype=weight.dtype)
    for m in sizes:
        F.linear(x[:m], weight)
    return len(sizes)


@torch.inference_mode()
def sweep_gemm_shapes(model_runner: WarmupRunner, tracker: PhaseProgress | None = None, *,
                      kernel_dir: Path | None = None, probe: KernelProbe | None = None) -> int:
    """Every (weight, M) of gemm_plan once, or, with a kernel map in kernel_dir learned on this
    GPU and these libraries, only the Ms that pick distinct kernels. Without a map the full
    sweep runs under `probe` (default: the profiler) and leaves one there. Returns the number
    of GEMMs run."""
    plan = gemm_plan(model_runner)
    keys = [gemm_key(w, m) for w, m in plan]
    total = sum(m for _, m in plan)
    kept: KernelMap | None = None
    why = "no compile cache (--cache-dir) to keep a kernel map in"
    identity: dict[str, str] = {}
    if kernel_dir is not None:
        identity = kernel_identity(plan[0][0].device) if plan else {}
        kept, why = load_kernel_map(kernel_dir, identity, keys)
    learned: dict[str, list[int]] | None = {} if kernel_dir is not None and kept is None else None
    count = 0
    for (weight, max_m), key in zip(plan, keys, strict=True):
        if kept is not None:
            count += _run(weight, kept.sizes[key])
        elif learned is not None:
            try:
                learned[key] = distinct_sizes((probe or profile_kernels)(weight, max_m))
                count += max_m
            except RuntimeError as exc:  # ProbeError, or the profiler's own failures
                if is_fatal_device_error(exc) or is_out_of_memory(exc):
                    raise  # the device's failure, not the probe's: the phase reports it
                # Whether the probe's calls ran is unknown: run them plainly; learn nothing.
                logger.info("shape sweeps: kernel probe of %s failed (%s: %s); sweeping every "
                            "size without learning", key, type(exc).__name__, exc)
                learned = None
                count += _run(weight, range(1, max_m + 1))
        else:
            count += _run(weight, range(1, max_m + 1))
        if tracker is not None:
            tracker.step()
    if kept is not None:
        logger.info("shape sweeps: %d of %d GEMM sizes, the distinct kernels of %d weights "
                    "(kernel map in %s)", count, total, len(plan), kernel_dir)
    elif learned is not None and kernel_dir is not None:
        distinct = sum(map(len, learned.values()))
        try:
            where = f"kept in {save_kernel_map(kernel_dir, KernelMap(identity, learned))}"
        except OSError as exc:  # a read-only or full cache volume costs the next start only
            where = f"not kept ({type(exc).__name__}: {exc}): the next start sweeps every size"
        logger.info("shape sweeps: every GEMM size, %d (%s); learned %d that pick distinct "
                    "kernels, %s", count, why, distinct, where)
    else:
        logger.info("shape sweeps: every GEMM size, %d (%s)", count, why)
    return count
