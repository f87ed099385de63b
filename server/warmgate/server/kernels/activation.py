"""SwiGLU's activation: silu(gate) * up over the two halves of the fused gate/up projection."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from warmgate.server.kernels._launch import elementwise_warps, pow2, unit_stride_last
from warmgate.server.kernels.pdl import launch_args, pdl_release, pdl_wait


@triton.jit
def _silu_and_mul_kernel(
    x_ptr, out_ptr,
    stride_x, stride_o, inter,
    BLOCK: tl.constexpr, USE_PDL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    pdl_wait(USE_PDL)  # x is the gate/up projection's output
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + offs, mask=mask, other=0.0).to(tl.float32)
    pdl_release(USE_PDL)
    act = gate / (1.0 + tl.exp(-gate))
    tl.store(out_ptr + row * stride_o + offs, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x: [T, 2I] -> [T, I] = silu(x[:, :I]) * x[:, I:], computed in float32."""
    two_inter = x.shape[-1]
    if two_inter % 2:
        raise ValueError(f"silu_and_mul: last dimension {two_inter} is not even")
    inter = two_inter // 2
    x2 = unit_stride_last(x.reshape(-1, two_inter))  # [T, 2I]
    out = torch.empty((x2.shape[0], inter), dtype=x.dtype, device=x.device)  # [T, I]
    if x2.shape[0] > 0:
        # One program per (row, 1024 columns) keeps enough programs in flight for small T.
        block = min(pow2(inter), 1024)
        grid = (x2.shape[0], triton.cdiv(inter, block))
        _silu_and_mul_kernel[grid](x2, out, x2.stride(0), out.stride(0), inter, BLOCK=block,
                                   num_warps=elementwise_warps(block), **launch_args(x2))
    return out.view(*x.shape[:-1], inter)
