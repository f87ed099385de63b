"""Qwen3's per-head q/k RMSNorm, as rope_cache's kernel applies it to the heads it has loaded.

The kernel holds each head as two float32 halves (the rotation pairs element i with i + D/2),
so the norm's sum of squares is the two halves' sums added: the only difference from
kernels.rms_norm over a [T * heads, D] view, which sums the row in one reduction. Everything
else is that kernel's arithmetic (x * rstd * w in float32), and the result is rounded to the
activation dtype as its output is, because the separate path's rotation reads those rounded
values: so a value differs from the separate path's at most where the two sums round apart.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def rms_norm_heads(x1, x2, weight_ptr, round_ptr, offs_d, d_mask, eps, HALF: tl.constexpr):
    """x1, x2: [BLOCK_H, BLOCK_HALF] float32, the first and second half of every head (masked
    lanes 0.0); weight_ptr: [D], one weight for every head. Returns both halves normalised,
    times the weight, rounded to round_ptr's element type and widened back to float32."""
    sum_sq = tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)  # [BLOCK_H]
    rstd = (1.0 / tl.sqrt(sum_sq / (2 * HALF) + eps))[:, None]
    w1 = tl.load(weight_ptr + offs_d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    w2 = tl.load(weight_ptr + HALF + offs_d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    act_ty = round_ptr.dtype.element_ty
    return ((x1 * rstd * w1).to(act_ty).to(tl.float32),
            (x2 * rstd * w2).to(act_ty).to(tl.float32))
