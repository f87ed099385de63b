"""RMSNorm with an optional fused residual add: one program per token row."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from warmgate.server.kernels._launch import elementwise_warps, pow2, unit_stride_last
from warmgate.server.kernels.pdl import launch_args, pdl_release, pdl_wait


@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr,
    stride_x, stride_r, stride_o, stride_ro,
    hidden, eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_H: tl.constexpr, USE_PDL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_H)
    mask = offs < hidden
    # The norm's weight is no kernel's output: read while the previous kernel finishes (PDL).
    w = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    pdl_wait(USE_PDL)
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + offs, mask=mask, other=0.0).to(tl.float32)
        # The residual stream is kept in the activation dtype, and the norm must see exactly
        # what the next layer's residual will hold, so round the sum before normalising it.
        s = (x + r).to(residual_out_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + row * stride_ro + offs, s, mask=mask)
        x = s.to(tl.float32)
    pdl_release(USE_PDL)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / hidden + eps)
    tl.store(out_ptr + row * stride_o + offs, (x * rstd * w).to(out_ptr.dtype.element_ty),
             mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """out = rmsnorm(x (+ residual)) * weight, norm in float32.

    x: [T, H]; weight: [H]; residual: [T, H] or None.
    Returns (out [T, H], new_residual [T, H]): new_residual is x + residual, or x itself.
    """
    hidden = x.shape[-1]
    x2 = unit_stride_last(x.reshape(-1, hidden))  # [T, H]
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)  # [T, H]
    num_rows = x2.shape[0]
    if residual is None:
        res_in, res_out, new_residual = x2, x2, x
    else:
        res_in = unit_stride_last(residual.reshape(-1, hidden))  # [T, H]
        res_out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)  # [T, H]
        new_residual = res_out.view(x.shape)
    if num_rows > 0:
        block = pow2(hidden)
        _rms_norm_kernel[(num_rows,)](
            x2, res_in, unit_stride_last(weight), out, res_out,
            x2.stride(0), res_in.stride(0), out.stride(0), res_out.stride(0),
            hidden, eps,
            HAS_RESIDUAL=residual is not None, BLOCK_H=block,
            num_warps=elementwise_warps(block), **launch_args(x2),
        )
    return out.view(x.shape), new_residual
