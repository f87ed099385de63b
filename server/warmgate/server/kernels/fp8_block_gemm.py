"""The block-scaled FP8 GEMM (the Qwen3-FP8 / DeepSeek weight format) in Triton.

y = x @ W^T where W is float8_e4m3fn [N, K] with one float32 scale per 128x128 block
(scale [ceil(N/128), ceil(K/128)]), and x is quantized on the fly to float8_e4m3fn with one
scale per token and 128-wide group of K (`quantize_groups`, its own small kernel). Every K
tile lies inside one 128-group, so the GEMM multiplies FP8 tiles on the tensor cores and
applies the two scales to each tile's partial product in the K loop, accumulating in float32.

The launch (tile sizes, warps, stages) is picked from a fixed table by the token count, so
serving never autotunes and a warmup compiles one kernel per bucket. `fp8_block_linear` is a
torch custom op: torch.compile keeps it as one call in the graph, and CUDA graphs capture it
(fixed shapes, no host sync).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from warmgate.server.config.fp8_config import FP8_BLOCK, FP8_E4M3_MAX
from warmgate.server.kernels._launch import upcast_dots

_MIN_SCALE = 1e-12


@dataclass(frozen=True)
class BlockGemmLaunch:
    block_m: int
    block_n: int
    block_k: int  # divides FP8_BLOCK: a K tile never straddles two scale groups
    num_warps: int
    num_stages: int


# (most tokens in the bucket, its launch): decode-sized batches waste little on a small M tile.
BLOCK_GEMM_TABLE: tuple[tuple[int, BlockGemmLaunch], ...] = (
    (16, BlockGemmLaunch(16, 64, 128, 4, 3)),
    (64, BlockGemmLaunch(32, 64, 128, 4, 3)),
    (256, BlockGemmLaunch(64, 128, 128, 4, 3)),
    (2**62, BlockGemmLaunch(128, 128, 128, 8, 3)),
)


def block_gemm_launch(num_tokens: int) -> BlockGemmLaunch:
    return next(launch for most, launch in BLOCK_GEMM_TABLE if num_tokens <= most)


@triton.jit(do_not_specialize=["M"])
def _group_quant_kernel(x_ptr, q_ptr, s_ptr, M, K, stride_xm, num_groups,
                        FP8_MAX: tl.constexpr, MIN_SCALE: tl.constexpr, GROUP: tl.constexpr):
    """One (row, 128-group): scale = amax / FP8_MAX, q = x / scale in float8_e4m3fn."""
    row = tl.program_id(0).to(tl.int64)
    group = tl.program_id(1)
    offs = group * GROUP + tl.arange(0, GROUP)
    mask = offs < K
    x = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=0) / FP8_MAX, MIN_SCALE)
    q = tl.clamp(x / scale, -FP8_MAX, FP8_MAX)
    tl.store(q_ptr + row * K + offs, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row * num_groups + group, scale)


def quantize_groups(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (any float dtype) -> (float8_e4m3fn [M, K], float32 [M, ceil(K/128)])."""
    m, k = x.shape
    groups = triton.cdiv(k, FP8_BLOCK)
    q = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(m, groups, dtype=torch.float32, device=x.device)
    if m:
        x = x if x.stride(-1) == 1 else x.contiguous()
        _group_quant_kernel[(m, groups)](x, q, scale, m, k, x.stride(0), groups,
                                         FP8_MAX=FP8_E4M3_MAX, MIN_SCALE=_MIN_SCALE,
                                         GROUP=FP8_BLOCK, num_warps=1)
    return q, scale


def quantize_groups_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_groups in torch (the tests' reference)."""
    m, k = x.shape
    groups = -(-k // FP8_BLOCK)
    padded = x.float().new_zeros(m, groups * FP8_BLOCK)
    padded[:, :k] = x.float()
    grouped = padded.view(m, groups, FP8_BLOCK)
    scale = (grouped.abs().amax(dim=-1) / FP8_E4M3_MAX).clamp(min=_MIN_SCALE)
    q = (grouped / scale[..., None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    return q.view(m, -1)[:, :k].to(torch.float8_e4m3fn), scale


# M (the token count) changes with every batch: specialised on divisibility by 16 as Triton
# does by default, a new token count could compile a second variant after the warmup.
@triton.jit(do_not_specialize=["M"])
def _block_gemm_kernel(a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, c_ptr, M, N, K,
                       stride_am, stride_asm, stride_bn, stride_bsn, stride_cm,
                       UPCAST: tl.constexpr, GROUP: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One BLOCK_M x BLOCK_N tile of c = (a * a_scale) @ (b * b_scale)^T."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + offs_n[None, :].to(tl.int64) * stride_bn + offs_k[:, None]
    a_scale_ptrs = a_scale_ptr + offs_m.to(tl.int64) * stride_asm
    b_scale_ptrs = b_scale_ptr + (offs_n // GROUP) * stride_bsn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, tl.cdiv(K, BLOCK_K)):
        k_mask = offs_k < K - k0 * BLOCK_K
        a = tl.load(a_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        group = (k0 * BLOCK_K) // GROUP
        a_s = tl.load(a_scale_ptrs + group, mask=m_mask, other=0.0)
        b_s = tl.load(b_scale_ptrs + group, mask=n_mask, other=0.0)
        if UPCAST:  # the interpreter: float32 products, exact for e4m3 inputs
            part = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        else:
            part = tl.dot(a, b)
        acc += part * a_s[:, None] * b_s[None, :]
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def block_scaled_mm(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor,
                    scale: torch.Tensor, out_dtype: torch.dtype,
                    launch: BlockGemmLaunch | None = None) -> torch.Tensor:
    """xq float8 [M, K] with x_scale [M, ceil(K/128)], weight float8 [N, K] with scale
    [ceil(N/128), ceil(K/128)] -> [M, N] in out_dtype. `launch` overrides the table's."""
    m, k = xq.shape
    n = weight.shape[0]
    if weight.shape[1] != k or scale.shape != (triton.cdiv(n, FP8_BLOCK),
                                               triton.cdiv(k, FP8_BLOCK)):
        raise ValueError(f"block_scaled_mm: x {tuple(xq.shape)}, weight {tuple(weight.shape)} "
                         f"and scale {tuple(scale.shape)} do not fit together")
    launch = block_gemm_launch(m) if launch is None else launch
    if FP8_BLOCK % launch.block_k:
        raise ValueError(f"block_k {launch.block_k} does not divide the {FP8_BLOCK}-wide groups")
    out = torch.empty(m, n, dtype=out_dtype, device=xq.device)
    if m == 0:
        return out
    grid = (triton.cdiv(m, launch.block_m), triton.cdiv(n, launch.block_n))
    _block_gemm_kernel[grid](
        xq, x_scale, weight, scale, out, m, n, k,
        xq.stride(0), x_scale.stride(0), weight.stride(0), scale.stride(0), out.stride(0),
        UPCAST=upcast_dots(xq), GROUP=FP8_BLOCK,
        BLOCK_M=launch.block_m, BLOCK_N=launch.block_n, BLOCK_K=launch.block_k,
        num_warps=launch.num_warps, num_stages=launch.num_stages)
    return out


@torch.library.custom_op("warmgate::fp8_block_linear", mutates_args=())
def fp8_block_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor
                     ) -> torch.Tensor:
    """x [M, K] -> [M, N] in x's dtype: quantize_groups, then block_scaled_mm."""
    xq, x_scale = quantize_groups(x)
    return block_scaled_mm(xq, x_scale, weight.contiguous(), scale.contiguous(), x.dtype)


@fp8_block_linear.register_fake
def _fp8_block_linear_shape(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor
                            ) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])
