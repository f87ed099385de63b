"""The dense GEMV with the RMSNorm in front of it (kernels/dense_gemv.py's kernel with NORM):
a layer's QKV or gate/up projection at decode sizes without the rms_norm launch; for gate/up,
SiLU-and-mul on the product too (ACT), without the activation's launch."""

from __future__ import annotations

import torch

from warmgate.server.kernels.dense_gemv import (
    GemvNorm,
    aligned,
    gemv_applies,
    launch_for,
    run_gemv,
)
from warmgate.server.kernels.gemv_plan import MAX_ROWS, GemvLaunch


def norm_gemv_applies(x: torch.Tensor, residual: torch.Tensor | None,
                      norm_weight: torch.Tensor, weight: torch.Tensor,
                      bias: torch.Tensor | None) -> bool:
    """Whether norm_gemv takes these: dense_gemv's arguments (1..16 rows), a residual of x's
    shape and dtype (if any) and a norm weight [K] of its dtype, contiguous and aligned."""
    if not gemv_applies(x, weight, bias):
        return False
    if residual is not None and not (residual.shape == x.shape and residual.dtype == x.dtype
                                     and residual.is_contiguous() and aligned(residual)):
        return False
    return (norm_weight.shape == (x.shape[1],) and norm_weight.dtype == x.dtype
            and norm_weight.is_contiguous() and aligned(norm_weight))


def norm_gemv(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
              eps: float, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
              launch: GemvLaunch | None = None, sm_count: int | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """kernels.rms_norm.rms_norm(x, norm_weight, eps, residual) then dense_gemv on its output,
    for 1..16 rows, in one launch: (out [M, N], the new residual [M, K], x + residual rounded,
    or x itself without one). Each program normalises the rows itself (their sums of squares
    over all of K first, then its K range tile by tile), so the normalised rows never go
    through memory; it is rms_norm's arithmetic, its rounding of the residual sum included
    (the residual is that kernel's to the bit; the normalised rows within an ulp where the
    sums of squares add in another order)."""
    return _run_normed("norm_gemv", x, residual, norm_weight, eps, weight, bias, launch,
                       sm_count, act=False)


def norm_act_applies(x: torch.Tensor, residual: torch.Tensor | None,
                     norm_weight: torch.Tensor, gate_up: torch.Tensor) -> bool:
    """Whether norm_act_gemv takes these: norm_gemv's arguments without a bias, gate/up rows
    of even count, and a plan that leaves K in one range (gate/up weights are wide: theirs
    always does)."""
    return (norm_gemv_applies(x, residual, norm_weight, gate_up, None)
            and gate_up.shape[0] % 2 == 0
            and launch_for(x, gate_up, None, None).splits == 1)


def norm_act_gemv(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                  eps: float, gate_up: torch.Tensor, *, launch: GemvLaunch | None = None,
                  sm_count: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """norm_gemv on the gate/up weight [2I, K], then kernels.activation.silu_and_mul, in one
    launch: (silu(gate) * up [M, I], the new residual [M, K]). Each program reads as many
    weight rows as norm_gemv's, half of them gate rows and half the up rows of the same
    columns, and rounds both products as norm_gemv stores them before the activation, so
    the result is silu_and_mul(norm_gemv(...)[0]) to the bit with the same launch."""
    return _run_normed("norm_act_gemv", x, residual, norm_weight, eps, gate_up, None, launch,
                       sm_count, act=True)


def _run_normed(name: str, x: torch.Tensor, residual: torch.Tensor | None,
                norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                bias: torch.Tensor | None, launch: GemvLaunch | None, sm_count: int | None,
                act: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Either function's checks and launch: (its output, the new residual)."""
    if not norm_gemv_applies(x, residual, norm_weight, weight, bias):
        raise ValueError(f"{name}: x {tuple(x.shape)} {x.dtype}, residual "
                         f"{None if residual is None else tuple(residual.shape)}, norm weight "
                         f"{tuple(norm_weight.shape)}, weight {tuple(weight.shape)}: not "
                         f"1..{MAX_ROWS} contiguous rows with a norm weight of their width and "
                         "dtype")
    res_out = x if residual is None else torch.empty_like(x)  # [M, K]
    return run_gemv(x, weight, bias, False, launch, sm_count,
                    GemvNorm(residual, norm_weight, eps, res_out), act=act), res_out
