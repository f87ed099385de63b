"""`--deterministic` on CUDA: TritonOps with the projections, the head and log-softmax on the
batch-invariant kernels (kernels.batch_invariant: tiles and K split from the weight's shape and
the SM count only, kernels/matmul_plan.py). RMSNorm, SiLU-and-mul and rotary already are: one
program per row reducing the whole row (rms_norm), or one result per element."""

from __future__ import annotations

import torch

from warmgate.server.kernels import batch_invariant
from warmgate.server.kernels.ops import TritonOps


class BatchInvariantOps(TritonOps):
    name = "triton-batch-invariant"

    def linear(self, x: torch.Tensor, weight: torch.Tensor,
               bias: torch.Tensor | None = None) -> torch.Tensor:
        """x: [T, K] @ weight [N, K]^T (+ bias [N]) -> [T, N]; a bias add is per element."""
        out = batch_invariant.matmul(x, weight)
        return out if bias is None else out + bias

    def log_softmax(self, logits: torch.Tensor) -> torch.Tensor:
        """logits: [R, V] -> float32 [R, V], one program per row."""
        return batch_invariant.log_softmax(logits)
