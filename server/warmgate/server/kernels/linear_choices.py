"""Which kernel runs a dense linear of a few rows: cuBLAS (F.linear) or the Triton GEMV
(kernels/dense_gemv.py), per (N, K, dtype, M).

Neither wins everywhere: the GEMV reads the weight at a higher fraction of the bandwidth where
cuBLAS splits K or picks a tile for larger M, cuBLAS may win where its kernel already streams
the weight well. So the warmup times both on the device for every weight shape at every row
count <= max_m a forward can run (runner/linear_tuning.py) and records the faster here. After
that the choice is a dictionary lookup on the host: a captured CUDA graph holds the kernel it
was captured with, and nothing is timed or compiled at serve time. A (shape, M) the warmup did
not time runs cuBLAS, as every linear did before, and is counted and logged once as a miss.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from warmgate.server.kernels.gemv_plan import MAX_ROWS

logger = logging.getLogger(__name__)

MAX_M = MAX_ROWS  # the most rows the GEMV takes
# The GEMV must be this much faster to replace cuBLAS, so that timing noise does not move a
# shape off the default from one start to the next.
MARGIN = 0.01

Key = tuple[int, int, torch.dtype, int]  # (N, K, dtype, M)
# (the weights of one shape, every layer's, M) -> (cuBLAS seconds, GEMV seconds) per call.
LinearTimer = Callable[[Sequence[torch.Tensor], int], tuple[float, float]]


@dataclass(frozen=True)
class LinearDecision:
    n: int
    k: int
    dtype: str
    m: int
    cublas_s: float
    gemv_s: float
    gemv: bool  # the GEMV runs this (shape, M)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def key_name(key: Key) -> str:
    """"NxK:dtype:mM", as reports and the compile cache entry name a pair."""
    n, k, dtype, m = key
    return f"{n}x{k}:{dtype_name(dtype)}:m{m}"


class LinearChoices:
    """The kernel per (N, K, dtype, M) for M <= max_m; filled by the warmup, read per call."""

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

    def use_gemv(self, m: int, weight: torch.Tensor) -> bool:
        """Whether x [m, K] @ weight^T runs the GEMV: a host-side lookup, never a timing."""
        if m > self.max_m:
            return False
        key = (weight.shape[0], weight.shape[1], weight.dtype, m)
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
            n, k, dtype, m = key
            logger.warning("dense linear %dx%d %s at M=%d: not timed by the warmup, runs "
                           "cuBLAS (%d misses so far)", n, k, dtype_name(dtype), m, self.misses)

    def decided(self, n: int, k: int, dtype: torch.dtype, m: int) -> bool:
        return (n, k, dtype, m) in self._gemv

    def decide(self, n: int, k: int, dtype: torch.dtype, m: int, cublas_s: float,
               gemv_s: float) -> bool:
        """Record the faster of the two timings for (n, k, dtype, m); returns whether it is
        the GEMV. One log line per decision, with both times."""
        gemv = gemv_s < cublas_s * (1.0 - MARGIN)
        self._gemv[(n, k, dtype, m)] = gemv
        self.decisions.append(LinearDecision(n, k, dtype_name(dtype), m, cublas_s, gemv_s,
                                             gemv))
        logger.info("dense linear %dx%d %s at M=%d: cuBLAS %.1f us, Triton GEMV %.1f us -> %s",
                    n, k, dtype_name(dtype), m, cublas_s * 1e6, gemv_s * 1e6,
                    "Triton GEMV" if gemv else "cuBLAS")
        return gemv

    def gemv_keys(self) -> list[Key]:
        """The (N, K, dtype, M) that run the GEMV."""
        return [key for key, gemv in self._gemv.items() if gemv]

    def by_name(self) -> dict[str, bool]:
        """{key_name: whether the GEMV runs it} for every decided pair."""
        return {key_name(key): gemv for key, gemv in self._gemv.items()}

    def preset(self, keys: dict[Key, bool]) -> None:
        """Choices made earlier (the compile cache entry's): used, never timed again."""
        self._gemv.update(keys)
