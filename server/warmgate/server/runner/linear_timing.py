"""Times cuBLAS (F.linear) against the Triton GEMV (kernels/dense_gemv.py) for one weight shape
at one row count, on the device, as a decode step would run them.

- Cold weights: a decode step reads each layer's weight once, after the other layers' weights
  went through L2, so the calls cycle through every layer's weight of the shape, across rounds
  and candidates, rather than rereading one (a single 8-33 MB weight would sit in L2 and time
  at several times the HBM bandwidth).
- Device time, not launch time: a captured graph launches nothing from the host, so the GPU
  is kept busy (torch.cuda._sleep) while the host queues the timed calls, and the events
  measure only the kernels.
- The first call of each compiles (Triton) or picks an algorithm (cuBLAS) and is not timed;
  the candidates then alternate round by round, and each keeps its median round.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

CALLS_PER_ROUND = 8
ROUNDS = 3
# GPU cycles of sleep ahead of a round: at ~1.5-2 GHz about 0.5 ms, several times what the host
# takes to queue a round's launches.
SLEEP_CYCLES = 1_000_000


def _round_seconds(fn: Callable[[torch.Tensor], torch.Tensor],
                   weights: Iterator[torch.Tensor]) -> float:
    """Seconds per call of CALLS_PER_ROUND calls, each on the next weight, queued behind a
    sleeping kernel."""
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(SLEEP_CYCLES)
    start.record()
    for _ in range(CALLS_PER_ROUND):
        fn(next(weights))
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) / 1e3 / CALLS_PER_ROUND


@torch.inference_mode()
def time_linears(weights: Sequence[torch.Tensor], m: int) -> tuple[float, float]:
    """(cuBLAS seconds, GEMV seconds) per call of x [m, K] @ w^T, w cycling through `weights`
    (every layer's weight of one shape, one dtype, on one CUDA device)."""
    from triton.runtime.errors import OutOfResources  # imports triton: CUDA only

    from warmgate.server.kernels.dense_gemv import dense_gemv

    first = weights[0]
    gen = torch.Generator(device=first.device).manual_seed(m)
    x = torch.randn(m, first.shape[1], device=first.device, generator=gen).to(first.dtype)
    candidates: list[Callable[[torch.Tensor], torch.Tensor]] = [
        lambda w: F.linear(x, w), lambda w: dense_gemv(x, w)]
    rounds: list[list[float]] = [[], []]
    cycle = itertools.cycle(weights)
    with torch.cuda.device(first.device):  # Triton launches on the current device
        F.linear(x, first)  # the first calls compile or pick the algorithm; not timed
        try:
            dense_gemv(x, first)
        except OutOfResources as exc:  # more shared memory or registers than this GPU has
            logger.info("dense GEMV %dx%d at M=%d does not fit this GPU (%s): cuBLAS",
                        first.shape[0], first.shape[1], m, exc)
            candidates.pop()
        torch.cuda.synchronize()
        for _ in range(ROUNDS):
            for i, fn in enumerate(candidates):
                rounds[i].append(_round_seconds(fn, cycle))
    return _seconds(rounds[0]), _seconds(rounds[1])


def _seconds(rounds: list[float]) -> float:
    """The median round; a candidate never timed is infinitely slow."""
    return sorted(rounds)[len(rounds) // 2] if rounds else float("inf")
