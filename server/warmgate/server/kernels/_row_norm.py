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
def rstd_of(sum_squares, width, eps):
    """1 / sqrt(mean square + eps) from a row's sum of squares over its width (a scalar, or one
    per row)."""
    return 1.0 / tl.sqrt(sum_squares / width + eps)


@triton.jit
def normed_tile(x_ptr, res_ptr, norm_w_ptr, offs, mask, rstd, HAS_RESIDUAL: tl.constexpr):
    """The normalised row at offs, rounded to the activation dtype as rms_norm stores it."""
    h = residual_sum(x_ptr, res_ptr, offs, mask, HAS_RESIDUAL)
    w = tl.load(norm_w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    return (h * rstd * w).to(x_ptr.dtype.element_ty)


@triton.jit
def rows_rstd(x_ptr, res_ptr, res_out_ptr, eps, rows, row_mask, store,
              K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
              HAS_RESIDUAL: tl.constexpr):
    """rstd_of for BLOCK_M rows of K (row r at offset rows[r] * K), the squares summed over K in
    BLOCK_K chunks: [BLOCK_M]. `store`: also store each residual sum to res_out (one program
    of a grid does)."""
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        offs = rows[:, None] * K + ks[None, :]
        mask = row_mask[:, None] & (ks < K)[None, :]
        h = residual_sum(x_ptr, res_ptr, offs, mask, HAS_RESIDUAL)
        if HAS_RESIDUAL:  # noqa: SIM102  # a constexpr test, then a runtime one: not one `and`
            if store:
                tl.store(res_out_ptr + offs, h.to(res_out_ptr.dtype.element_ty), mask=mask)
        ss += tl.sum(h * h, axis=1)
    return rstd_of(ss, K, eps)


@triton.jit
def normed_rows(x_ptr, res_ptr, norm_w_ptr, offs, ks, mask, k_mask, rstd,
                HAS_RESIDUAL: tl.constexpr):
    """normed_tile for a [rows, ks] tile at offs, each row with its rstd [rows]."""
    h = residual_sum(x_ptr, res_ptr, offs, mask, HAS_RESIDUAL)
    w = tl.load(norm_w_ptr + ks, mask=k_mask, other=0.0).to(tl.float32)
    return (h * rstd[:, None] * w[None, :]).to(x_ptr.dtype.element_ty)
