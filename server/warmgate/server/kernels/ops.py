"""TritonOps: the runner's non-attention ops on Triton kernels (a drop-in for TorchOps)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from warmgate.server.kernels.activation import silu_and_mul
from warmgate.server.kernels.rms_norm import rms_norm
from warmgate.server.kernels.rotary import rotary_embedding


class TritonOps:
    """Same methods and semantics as runner.ops.TorchOps; every result is a new tensor."""

    name = "triton"
    row_wise = False

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [T, H], weight: [H] -> (out [T, H], new_residual [T, H]); see kernels.rms_norm."""
        return rms_norm(x, weight, eps, residual)

    def linear(self, x: torch.Tensor, weight: torch.Tensor,
               bias: torch.Tensor | None = None) -> torch.Tensor:
        """x: [T, K] @ weight [N, K]^T (+ bias [N]) -> [T, N] (cuBLAS)."""
        return F.linear(x, weight) if bias is None else F.linear(x, weight, bias)

    def log_softmax(self, logits: torch.Tensor) -> torch.Tensor:
        """logits: [R, V] -> float32 [R, V]."""
        return torch.log_softmax(logits.float(), dim=-1)

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, 2I] -> [T, I] = silu(x[:, :I]) * x[:, I:]."""
        return silu_and_mul(x)

    def rotary(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
               cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [T, Hq, D], k: [T, Hk, D], positions: [T] int64, cos_sin_cache: [max_pos, D]."""
        return rotary_embedding(q, k, positions, cos_sin_cache)
