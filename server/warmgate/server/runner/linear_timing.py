"""Times cuBLAS (F.linear) against the Triton GEMV (kernels/dense_gemv.py) for one weight shape
at one row count, on the device, as a decode step would run them; for the MLP's down
projection, SiLU-and-mul then either linear against the GEMV with the activation fused in;
for the QKV and gate/up projections, the RMSNorm then either linear against the GEMV with the
norm fused in (kernels/norm_gemv.py); for gate/up, those and SiLU-and-mul after each against
the GEMV with both fused in.

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

# One candidate: a call on one weight.
LinearFn = Callable[[torch.Tensor], torch.Tensor]
CALLS_PER_ROUND = 8
ROUNDS = 3
# GPU cycles of sleep ahead of a round: at ~1.5-2 GHz about 0.5 ms, several times what the host
# takes to queue a round's launches.
SLEEP_CYCLES = 1_000_000
# The norm's epsilon in the timed calls and the compiles before them: any model's costs the same.
NORM_EPS = 1e-6


def _round_seconds(fn: LinearFn,
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


def _candidates(op: str, first: torch.Tensor, m: int) -> list[LinearFn]:
    """The defaults, then the Triton kernel last, each a call on one weight at m rows of
    seeded random inputs. LINEAR: F.linear, dense_gemv. SILU_MUL (x is gate_up [m, 2K]):
    silu_and_mul then either linear, silu_mul_gemv. NORM (x and a residual [m, K], a norm
    weight [K]): kernels.rms_norm then either linear, norm_gemv. NORM_ACT (the same inputs, w
    gate/up): NORM's three, each then silu_and_mul, norm_act_gemv."""
    from warmgate.server.kernels.activation import silu_and_mul
    from warmgate.server.kernels.dense_gemv import dense_gemv, silu_mul_gemv
    from warmgate.server.kernels.linear_choices import LINEAR, NORM, NORM_ACT
    from warmgate.server.kernels.norm_gemv import norm_act_gemv, norm_gemv
    from warmgate.server.kernels.rms_norm import rms_norm

    gen = torch.Generator(device=first.device).manual_seed(m)
    k = first.shape[1]

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=first.device, generator=gen).to(first.dtype)

    if op == LINEAR:
        x = rand(m, k)
        return [lambda w: F.linear(x, w), lambda w: dense_gemv(x, w)]
    if op in (NORM, NORM_ACT):
        x, residual, norm_weight = rand(m, k), rand(m, k), rand(k)
        norm_fns: list[LinearFn] = [
            lambda w: F.linear(rms_norm(x, norm_weight, NORM_EPS, residual)[0], w),
            lambda w: dense_gemv(rms_norm(x, norm_weight, NORM_EPS, residual)[0], w),
            lambda w: norm_gemv(x, residual, norm_weight, NORM_EPS, w)[0]]
        if op == NORM:
            return norm_fns
        return [*(lambda w, fn=fn: silu_and_mul(fn(w)) for fn in norm_fns),
                lambda w: norm_act_gemv(x, residual, norm_weight, NORM_EPS, w)[0]]
    gate_up = rand(m, 2 * k)
    return [lambda w: F.linear(silu_and_mul(gate_up), w),
            lambda w: dense_gemv(silu_and_mul(gate_up), w),
            lambda w: silu_mul_gemv(gate_up, w)]


@torch.inference_mode()
def time_linears(weights: Sequence[torch.Tensor], m: int, op: str) -> tuple[float, float]:
    """(default seconds, Triton seconds) per call of `op` on m rows, w cycling through
    `weights` (every layer's weight of one shape, one dtype, on one CUDA device): the faster
    default (_candidates) against the Triton kernel."""
    from triton.runtime.errors import OutOfResources  # imports triton: CUDA only

    first = weights[0]
    candidates = _candidates(op, first, m)
    rounds: list[list[float]] = [[] for _ in candidates]
    cycle = itertools.cycle(weights)
    with torch.cuda.device(first.device):  # Triton launches on the current device
        fits = []
        for i, fn in enumerate(candidates):  # the first calls compile or pick the algorithm
            try:
                fn(first)
                fits.append(i)
            except OutOfResources as exc:  # more shared memory or registers than this GPU has
                logger.info("dense linear %s %dx%d at M=%d: a Triton launch does not fit "
                            "this GPU (%s)", op, first.shape[0], first.shape[1], m, exc)
        torch.cuda.synchronize()
        for _ in range(ROUNDS):
            for i in fits:
                rounds[i].append(_round_seconds(candidates[i], cycle))
    return min(_seconds(r) for r in rounds[:-1]), _seconds(rounds[-1])


def _seconds(rounds: list[float]) -> float:
    """The median round; a candidate never timed is infinitely slow."""
    return sorted(rounds)[len(rounds) // 2] if rounds else float("inf")
