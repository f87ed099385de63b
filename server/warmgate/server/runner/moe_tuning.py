"""Wires the model's fused MoE launches (runner.moe_launches.MoELaunches) to this runner: the
token budget caps the last bucket, and on CUDA a timer that runs the kernel on the first MoE
layer's weights, so a bucket without a launch is autotuned, each autotune reported to the JIT
monitor as an "autotune" event (counted after ready like a compile). On a CPU the torch
reference runs and there is nothing to time: the table is used.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from warmgate.server.config.moe_kernel import MoELaunch
from warmgate.server.jit import JitMonitor
from warmgate.server.jit.events import AUTOTUNE

if TYPE_CHECKING:
    from warmgate.server.runner.model import LlamaModel
    from warmgate.server.runner.moe import MoEBlock

logger = logging.getLogger(__name__)

# Timed calls per candidate after the one that compiles it: the median of these is its time.
TIMED_CALLS = 5


def attach_moe_tuning(model: LlamaModel, monitor: JitMonitor, max_tokens: int) -> None:
    launches = model.moe_launches
    if launches is None:
        return
    launches.max_tokens = max_tokens
    launches.on_autotune = lambda name, seconds: _report(monitor, name, seconds)
    first = model.layers[0].moe
    if model.device.type == "cuda" and first is not None:
        launches.timer = lambda launch, tokens: time_launch(first, launch, tokens)
        launches.capturing = torch.cuda.is_current_stream_capturing


def _report(monitor: JitMonitor, name: str, seconds: float) -> None:
    monitor.record(AUTOTUNE, name=name, seconds=seconds)


@torch.inference_mode()
def time_launch(moe: MoEBlock, launch: MoELaunch, num_tokens: int) -> float:
    """Seconds one fused_moe call at num_tokens takes with `launch` (CUDA events; the first
    call compiles and is not timed). Routing is uniform over the experts, what a trained
    router spreads a batch to on average."""
    from triton.runtime.errors import OutOfResources  # imports triton: CUDA only

    from warmgate.server.kernels.fused_moe import fused_moe

    e, top_k = moe.w13.shape[0], moe.top_k
    device = moe.w13.device
    gen = torch.Generator(device=device).manual_seed(num_tokens)
    hidden = torch.randn(num_tokens, moe.w13.shape[2], device=device, dtype=moe.router.dtype,
                         generator=gen)  # the served dtype (FP8 experts: not w13's)
    # FP8 experts run (and are timed) with their block scales.
    scales = {"w13_scale": moe.w13_scale, "w2_scale": moe.w2_scale}
    ids = torch.rand(num_tokens, e, device=device, generator=gen).topk(top_k, dim=-1).indices
    weights = torch.full((num_tokens, top_k), 1.0 / top_k, device=device)
    try:
        fused_moe(hidden, moe.w13, moe.w2, weights, ids, launch, **scales)
    except OutOfResources as exc:  # more shared memory or registers than the GPU has
        logger.info("fused MoE autotune: %s does not fit this GPU (%s); not a candidate",
                    launch, exc)
        return float("inf")
    times = []
    for _ in range(TIMED_CALLS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fused_moe(hidden, moe.w13, moe.w2, weights, ids, launch, **scales)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]
