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
from warmgate.server.runner.cuda_graphs import capturing

if TYPE_CHECKING:
    from warmgate.server.runner.model import LlamaModel
    from warmgate.server.runner.moe import MoEBlock

logger = logging.getLogger(__name__)

# A candidate's time is a CUDA graph's of calls that route to experts of their own, replayed:
# its weights stream from HBM as in a decode step, whose every layer reads other experts, and
# no host launch overhead enters. Timed eagerly, one call at a time on one set of experts
# (its weights partly in L2, the host's launch overhead inside every time), the pick changed
# from process to process, and with it the MoE's batch-1 step (bench/results/README.md,
# run 29).
TIMED_REPLAYS = 5  # the median of these is the candidate's time
MAX_ROUTES = 16  # calls a graph holds at most (Qwen3-30B-A3B at one token: 128 / 8)


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


def route_sets(num_experts: int, top_k: int, num_tokens: int, device: torch.device,
               gen: torch.Generator) -> list[torch.Tensor]:
    """Expert ids [num_tokens, top_k] (distinct in a row) for the calls of one timing graph:
    together they read every expert about once, so no call finds its weights in L2 from the
    call before (at most MAX_ROUTES calls; one where a call's rows reach every expert)."""
    calls = max(1, min(MAX_ROUTES, -(-num_experts // (num_tokens * top_k))))
    order = torch.randperm(num_experts, generator=gen, device=gen.device).to(device)
    slot = torch.arange(num_tokens * top_k, device=device).view(num_tokens, top_k)
    return [order[(c * num_tokens * top_k + slot) % num_experts] for c in range(calls)]


@torch.inference_mode()
def time_launch(moe: MoEBlock, launch: MoELaunch, num_tokens: int) -> float:
    """Seconds one fused_moe call at num_tokens takes with `launch`: the median replay of a
    CUDA graph of route_sets' calls over their count (the eager calls before the capture
    compile it). Routing is uniform over the experts, what a trained router spreads a batch
    to on average."""
    from triton.runtime.errors import OutOfResources  # imports triton: CUDA only

    from warmgate.server.kernels.fused_moe import fused_moe

    e, top_k = moe.w13.shape[0], moe.top_k
    device = moe.w13.device
    gen = torch.Generator().manual_seed(num_tokens)
    hidden = torch.randn(num_tokens, moe.w13.shape[2], generator=gen).to(
        device, moe.router.dtype)  # the served dtype (FP8 experts: not w13's)
    routes = route_sets(e, top_k, num_tokens, device, gen)
    weights = torch.full((num_tokens, top_k), 1.0 / top_k, device=device)

    def calls() -> None:
        for ids in routes:  # FP8 experts run (and are timed) with their block scales
            fused_moe(hidden, moe.w13, moe.w2, weights, ids, launch,
                      w13_scale=moe.w13_scale, w2_scale=moe.w2_scale)

    try:
        calls()
    except OutOfResources as exc:  # more shared memory or registers than the GPU has
        logger.info("fused MoE autotune: %s does not fit this GPU (%s); not a candidate",
                    launch, exc)
        return float("inf")
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    # The GEMM sweep may be running on its own thread (warmup/gemm_background.py).
    with capturing(graph, None, torch.cuda.Stream(device), error_mode="thread_local"):
        calls()
    graph.replay()
    times = []
    for _ in range(TIMED_REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / len(routes))
    return sorted(times)[len(times) // 2]
