"""`--deterministic` on the CPU: every reducing op runs one token row at a time.

Why: the CPU's default kernels are not batch invariant. MKL's GEMM blocks and vectorises a
row's K-reduction differently for another row count, and ATen's reductions and vectorised
transcendentals split work by the tensor's total size, so the same row can round differently
alone and inside a batch (tests/test_deterministic_kernels.py shows the default differing).
Run alone, a row is the same call on the same shape with the same bits, whatever else was in
the step: invariant by construction, at the price of one call per row. Each row is copied out
first so every call also reads from a fresh allocation (the same alignment for every row).
Element-wise ops without a transcendental (residual adds, rotary's multiply-adds) are exact
per element and stay batched.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from warmgate.server.runner.ops import TorchOps

RowFn = Callable[[torch.Tensor], torch.Tensor]


def by_rows(fn: RowFn, x: torch.Tensor) -> torch.Tensor:
    """fn over each row of x [T, ...] alone (as [1, ...]), concatenated: [T, ...]."""
    if x.shape[0] <= 1:
        return fn(x.clone())
    return torch.cat([fn(x[i:i + 1].clone()) for i in range(x.shape[0])])


class RowwiseTorchOps(TorchOps):
    """TorchOps with every reduction a row at a time (see the module's docstring)."""

    name = "torch-rowwise"
    row_wise = True

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x, residual: [T, H] -> (normed [T, H], x + residual [T, H])."""
        if residual is not None:
            x = x + residual
        return by_rows(lambda row: TorchOps.rms_norm(self, row, weight, eps)[0], x), x

    def linear(self, x: torch.Tensor, weight: torch.Tensor,
               bias: torch.Tensor | None = None) -> torch.Tensor:
        """x: [T, K] -> [T, N], each row its own [1, K] GEMM."""
        return by_rows(lambda row: TorchOps.linear(self, row, weight, bias), x)

    def log_softmax(self, logits: torch.Tensor) -> torch.Tensor:
        """logits: [R, V] -> float32 [R, V]."""
        return by_rows(lambda row: TorchOps.log_softmax(self, row), logits)

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, 2I] -> [T, I]; silu's exp is vectorised in chunks of the whole tensor."""
        return by_rows(lambda row: TorchOps.silu_and_mul(self, row), x)
