"""kernels/rms_norm.py's arithmetic for a kernel that normalises its own input row (the
norm-fused GEMV, the norm-fused MoE router): the residual sum rounded to the activation dtype
as the residual stream holds it, the reciprocal root mean square of that row, and the
normalised values of any part of it, rounded as rms_norm stores them."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def residual_sum(x_ptr, res_ptr, offs, mask, HAS_RESIDUAL: tl.constexpr):
    """x (+ the residual) at offs in float32, the sum rounded to x's dtype first."""
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    h = x.to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        h = (h + r).to(x.dtype).to(tl.float32)
    return h


@triton.jit
def rstd_of(h, width, eps):
    """1 / sqrt(mean of the squares of the whole row h (zeros past its width) + eps)."""
    return 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / width + eps)


@triton.jit
def normed_tile(x_ptr, res_ptr, norm_w_ptr, offs, mask, rstd, HAS_RESIDUAL: tl.constexpr):
    """The normalised row at offs, rounded to the activation dtype as rms_norm stores it."""
    h = residual_sum(x_ptr, res_ptr, offs, mask, HAS_RESIDUAL)
    w = tl.load(norm_w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    return (h * rstd * w).to(x_ptr.dtype.element_ty)
