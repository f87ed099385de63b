"""TritonOps: the runner's non-attention ops on Triton kernels (a drop-in for TorchOps)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F

from warmgate.server.kernels.activation import silu_and_mul
from warmgate.server.kernels.dense_gemv import dense_gemv, gemv_applies, silu_mul_gemv
from warmgate.server.kernels.linear_choices import NORM, NORM_ACT, SILU_MUL, LinearChoices
from warmgate.server.kernels.norm_gemv import (
    norm_act_applies,
    norm_act_gemv,
    norm_gemv,
    norm_gemv_applies,
)
from warmgate.server.kernels.rms_norm import rms_norm
from warmgate.server.kernels.rotary import rotary_embedding


class NormFusingMoE(Protocol):
    """What norm_moe needs of a MoE block (runner.moe.MoEBlock: kernels do not import the
    runner)."""

    normed_experts: Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor, float],
                             tuple[torch.Tensor, torch.Tensor]]

    def fuses_norm(self, x: torch.Tensor, residual: torch.Tensor | None,
                   norm_weight: torch.Tensor) -> bool: ...

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor: ...


class TritonOps:
    """Same methods and semantics as runner.ops.TorchOps; every result is a new tensor."""

    name = "triton"
    row_wise = False

    def __init__(self) -> None:
        # The kernel per (weight shape, M) for a few rows, filled by the warmup
        # (runner/linear_tuning.py). A subclass with a linear of its own (the batch-invariant
        # ops) never reads it, so it has none and nothing is timed for it.
        self.linear_choices = (LinearChoices() if type(self).linear is TritonOps.linear
                               else None)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [T, H], weight: [H] -> (out [T, H], new_residual [T, H]); see kernels.rms_norm."""
        return rms_norm(x, weight, eps, residual)

    def linear(self, x: torch.Tensor, weight: torch.Tensor,
               bias: torch.Tensor | None = None) -> torch.Tensor:
        """x: [T, K] @ weight [N, K]^T (+ bias [N]) -> [T, N]: the Triton GEMV where the warmup
        timed it faster than cuBLAS for this weight shape and T (a host-side lookup), else
        cuBLAS."""
        choices = self.linear_choices
        if (choices is not None and choices.use_gemv(x.shape[0], weight)
                and gemv_applies(x, weight, bias)):
            return dense_gemv(x, weight, bias)
        return F.linear(x, weight) if bias is None else F.linear(x, weight, bias)

    def norm_linear(self, x: torch.Tensor, residual: torch.Tensor | None,
                    norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                    bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """rms_norm then linear -> (out [T, N], new_residual [T, H]): for rows where the
        warmup timed it faster than the two ops (1..16 of them), one launch (kernels.norm_gemv:
        the norm computed in the GEMV's loads, the rms_norm launch and its output's round trip
        through memory gone); else the two ops."""
        choices = self.linear_choices
        if (choices is not None and choices.use_gemv(x.shape[0], weight, NORM)
                and norm_gemv_applies(x, residual, norm_weight, weight, bias)):
            return norm_gemv(x, residual, norm_weight, eps, weight, bias)
        normed, residual = self.rms_norm(x, norm_weight, eps, residual)
        return self.linear(normed, weight, bias), residual

    def norm_moe(self, x: torch.Tensor, residual: torch.Tensor | None,
                 norm_weight: torch.Tensor, eps: float, moe: NormFusingMoE
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """rms_norm then the MoE block -> (out [T, H], new_residual [T, H]): where the block's
        fused router takes the rows (a few tokens, on CUDA), the norm runs in the router's
        launch (kernels.moe_router.norm_router_top_k, this class's rms_norm arithmetic), and
        the rms_norm launch is gone; else the two. (--deterministic on CUDA, whose ops
        subclass this, refuses MoE models.)"""
        if moe.fuses_norm(x, residual, norm_weight):
            return moe.normed_experts(x, residual, norm_weight, eps)
        normed, residual = self.rms_norm(x, norm_weight, eps, residual)
        return moe(normed), residual

    def log_softmax(self, logits: torch.Tensor) -> torch.Tensor:
        """logits: [R, V] -> float32 [R, V]."""
        return torch.log_softmax(logits.float(), dim=-1)

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, 2I] -> [T, I] = silu(x[:, :I]) * x[:, I:]."""
        return silu_and_mul(x)

    def silu_mul_linear(self, gate_up: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """gate_up: [T, 2I] -> silu_and_mul -> @ weight [N, I]^T -> [T, N]: one Triton kernel
        where the warmup timed it faster than the two ops for this shape and T (its result is
        the Triton GEMV's on silu_and_mul's output, to the bit), else the two ops."""
        choices = self.linear_choices
        if (choices is not None and choices.use_gemv(gate_up.shape[0], weight, SILU_MUL)
                and gemv_applies(gate_up, weight, None, silu_mul=True)):
            return silu_mul_gemv(gate_up, weight)
        return self.linear(self.silu_and_mul(gate_up), weight)

    def norm_mlp(self, x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
                 eps: float, gate_up: torch.Tensor, down: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """The SwiGLU MLP with its norm -> (out [T, H], new_residual [T, H]). Where the
        activation is not fused into the down projection (silu_mul_linear's choice) and the
        warmup timed it faster for these rows, the norm, gate/up and SiLU-and-mul run as one
        launch (kernels.norm_gemv.norm_act_gemv) and the down projection takes its output;
        else norm_linear then silu_mul_linear."""
        choices, m = self.linear_choices, x.shape[0]
        # Whether the launch takes these first: a weight it cannot take was never timed, and
        # its lookup would count as a miss.
        if (choices is not None and not choices.use_gemv(m, down, SILU_MUL)
                and norm_act_applies(x, residual, norm_weight, gate_up)
                and choices.use_gemv(m, gate_up, NORM_ACT)):
            act, residual = norm_act_gemv(x, residual, norm_weight, eps, gate_up)
            return self.linear(act, down), residual
        gate_up_out, residual = self.norm_linear(x, residual, norm_weight, eps, gate_up)
        return self.silu_mul_linear(gate_up_out, down), residual

    def rotary(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
               cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [T, Hq, D], k: [T, Hk, D], positions: [T] int64, cos_sin_cache: [max_pos, D]."""
        return rotary_embedding(q, k, positions, cos_sin_cache)
