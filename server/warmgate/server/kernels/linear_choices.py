"""Which kernel runs a dense linear of a few rows: cuBLAS (F.linear) or the Triton GEMV
(kernels/dense_gemv.py), per (op, N, K, dtype, M).

Neither wins everywhere: the GEMV reads the weight at a higher fraction of the bandwidth where
cuBLAS splits K or picks a tile for larger M, cuBLAS may win where its kernel already streams
the weight well. So the warmup times both on the device for every weight shape at every row
count <= max_m a forward can run (runner/linear_tuning.py) and records the faster here. After
that the choice is a dictionary lookup on the host: a captured CUDA graph holds the kernel it
was captured with, and nothing is timed or compiled at serve time. A (shape, M) the warmup did
not time runs cuBLAS, as every linear did before, and is counted and logged once as a miss.

Four ops: LINEAR, x @ w^T (the GEMV against cuBLAS); SILU_MUL, the MLP's silu_and_mul then
its down projection (the GEMV with the activation fused in, dense_gemv.silu_mul_gemv, against
the two launches, the projection on the better of its two kernels); NORM, a layer's RMSNorm
then its QKV or gate/up projection (kernels/norm_gemv.py against the two launches, likewise);
NORM_ACT, the MLP's RMSNorm, gate/up projection and silu_and_mul (norm_gemv.norm_act_gemv,
one launch, against NORM's candidates and the activation's launch), which runs only where
SILU_MUL is not chosen: the activation goes into one projection or the other.
Each fused op is timed as itself: a fused launch can lose where its plain GEMV wins (the 8B's
norm-fused gate/up at 8 rows on an H100, bench/results/h100-ab-merge-step-kernels.txt), so a
choice read off LINEAR could give a step its slowest launch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from warmgate.server.kernels.gemv_plan import MAX_ROWS

logger = logging.getLogger(__name__)

MAX_M = MAX_ROWS  # the most rows the GEMV takes
# The GEMV must be this much faster to replace the default, so that timing noise does not
# move a shape off it from one start to the next.
MARGIN = 0.01
LINEAR = "linear"
SILU_MUL = "silu_mul"
NORM = "norm"
NORM_ACT = "norm_act"
# What each op's decision weighs, for the log lines: (the default, the Triton kernel).
_CANDIDATES = {LINEAR: ("cuBLAS", "Triton GEMV"),
               SILU_MUL: ("SiLU-and-mul then the linear", "the fused Triton GEMV"),
               NORM: ("RMSNorm then the linear", "the norm-fused Triton GEMV"),
               NORM_ACT: ("RMSNorm, the linear, then SiLU-and-mul",
                          "the norm- and activation-fused Triton GEMV")}

Key = tuple[str, int, int, torch.dtype, int]  # (op, N, K, dtype, M)
# (the weights of one shape, every layer's, M, op) -> (default seconds, Triton seconds) per
# call.
LinearTimer = Callable[[Sequence[torch.Tensor], int, str], tuple[float, float]]


@dataclass(frozen=True)
class LinearDecision:
    op: str
    n: int
    k: int
    dtype: str
    m: int
    default_s: float
    gemv_s: float
    gemv: bool  # the Triton kernel runs this (op, shape, M)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def key_name(key: Key) -> str:
    """"NxK:dtype:mM" (a fused op's pair: "silu_mul:", "norm:" or "norm_act:" before it), as
    reports and the compile cache entry name a pair."""
    op, n, k, dtype, m = key
    return f"{'' if op == LINEAR else op + ':'}{n}x{k}:{dtype_name(dtype)}:m{m}"


class LinearChoices:
    """The kernel per (op, N, K, dtype, M) for M <= max_m; filled by the warmup, read per
    call."""

    def __init__(self, max_m: int = MAX_M) -> None:
        self.max_m = max_m
        self._gemv: dict[Key, bool] = {}
        self.decisions: list[LinearDecision] = []
        # Set by the runner on CUDA: what the warmup times the candidates with. Only
        # runner.linear_tuning.choose_linears calls it; a lookup never does.
        self.timer: LinearTimer | None = None
        # Whether the warmup has decided every (shape, M) it plans: only then is a lookup that
        # finds nothing a miss worth a word (before it, every linear runs cuBLAS by design).
        self.filled = False
        self.misses = 0
        self._missed: set[Key] = set()

    def use_gemv(self, m: int, weight: torch.Tensor, op: str = LINEAR) -> bool:
        """Whether op on m rows and weight runs the Triton kernel: a host-side lookup, never a
        timing."""
        # No rows (the head of a step whose prefill chunks end no prompt samples none): there
        # is nothing to launch or time, so it is no miss either.
        if m < 1 or m > self.max_m:
            return False
        key = (op, weight.shape[0], weight.shape[1], weight.dtype, m)
        found = self._gemv.get(key)
        if found is None:
            if self.filled:
                self._miss(key)
            return False
        return found

    def _miss(self, key: Key) -> None:
        self.misses += 1
        if key not in self._missed:
            self._missed.add(key)
            logger.warning("dense linear %s: not timed by the warmup, runs %s (%d misses so "
                           "far)", key_name(key), _CANDIDATES[key[0]][0], self.misses)

    def decided(self, key: Key) -> bool:
        return key in self._gemv

    def decide(self, key: Key, default_s: float, gemv_s: float) -> bool:
        """Record the faster of the two timings for key; returns whether it is the Triton
        kernel. One log line per decision, with both times."""
        op, n, k, dtype, m = key
        gemv = gemv_s < default_s * (1.0 - MARGIN)
        self._gemv[key] = gemv
        self.decisions.append(LinearDecision(op, n, k, dtype_name(dtype), m, default_s,
                                             gemv_s, gemv))
        default, triton = _CANDIDATES[op]
        logger.info("dense linear %s: %s %.1f us, %s %.1f us -> %s", key_name(key), default,
                    default_s * 1e6, triton, gemv_s * 1e6, triton if gemv else default)
        return gemv

    def gemv_keys(self) -> list[Key]:
        """The keys that run the Triton kernel."""
        return [key for key, gemv in self._gemv.items() if gemv]

    def by_name(self) -> dict[str, bool]:
        """{key_name: whether the Triton kernel runs it} for every decided key."""
        return {key_name(key): gemv for key, gemv in self._gemv.items()}

    def preset(self, keys: dict[Key, bool]) -> None:
        """Choices made earlier (the compile cache entry's): used, never timed again."""
        self._gemv.update(keys)
