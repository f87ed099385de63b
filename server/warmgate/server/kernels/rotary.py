"""Rotary position embedding, NeoX / Llama "rotate half" layout, for q and k in one launch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from warmgate.server.kernels._launch import pow2, unit_stride_last


@triton.jit
def _rotate_heads(src_ptr, dst_ptr, stride_st, stride_sh, stride_dt, stride_dh, token,
                  num_heads, cos, sin, offs_d, d_mask,
                  BLOCK_H: tl.constexpr, HALF: tl.constexpr):
    offs_h = tl.arange(0, BLOCK_H)
    mask = (offs_h[:, None] < num_heads) & d_mask[None, :]  # [BLOCK_H, BLOCK_HALF]
    src = src_ptr + token * stride_st + offs_h[:, None] * stride_sh + offs_d[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    dst = dst_ptr + token * stride_dt + offs_h[:, None] * stride_dh + offs_d[None, :]
    out_ty = dst_ptr.dtype.element_ty
    tl.store(dst, (x1 * cos[None, :] - x2 * sin[None, :]).to(out_ty), mask=mask)
    tl.store(dst + HALF, (x2 * cos[None, :] + x1 * sin[None, :]).to(out_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, q_out_ptr, k_out_ptr, positions_ptr, cos_sin_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh,
    stride_qot, stride_qoh, stride_kot, stride_koh, stride_cs,
    num_q_heads, num_k_heads,
    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token)
    offs_d = tl.arange(0, BLOCK_HALF)
    d_mask = offs_d < HALF
    # The cache row holds cos in its first half and sin in its second.
    cos = tl.load(cos_sin_ptr + pos * stride_cs + offs_d, mask=d_mask, other=0.0)
    sin = tl.load(cos_sin_ptr + pos * stride_cs + HALF + offs_d, mask=d_mask, other=0.0)
    _rotate_heads(q_ptr, q_out_ptr, stride_qt, stride_qh, stride_qot, stride_qoh, token,
                  num_q_heads, cos, sin, offs_d, d_mask, BLOCK_H=BLOCK_HQ, HALF=HALF)
    _rotate_heads(k_ptr, k_out_ptr, stride_kt, stride_kh, stride_kot, stride_koh, token,
                  num_k_heads, cos, sin, offs_d, d_mask, BLOCK_H=BLOCK_HK, HALF=HALF)


def rotary_embedding(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                     cos_sin_cache: torch.Tensor, inplace: bool = False,
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, Hq, D] and k [T, Hk, D] by positions [T] (int64).

    cos_sin_cache: [max_pos, D] float32, cos in the first D/2 columns and sin in the last.
    Returns new contiguous tensors, or q and k themselves when `inplace` (each element is read
    before it is written by the same program, so aliasing is safe).
    """
    num_tokens, num_q_heads, head_dim = q.shape
    num_k_heads = k.shape[1]
    if head_dim % 2 or cos_sin_cache.shape[-1] != head_dim:
        raise ValueError(f"rotary: head_dim {head_dim} must be even and match the cos/sin "
                         f"cache width {cos_sin_cache.shape[-1]}")
    q = unit_stride_last(q)
    k = unit_stride_last(k)
    cos_sin = unit_stride_last(cos_sin_cache.to(torch.float32))  # [max_pos, D]
    if inplace:
        q_out, k_out = q, k
    else:
        q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # [T, Hq, D]
        k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)  # [T, Hk, D]
    if num_tokens > 0:
        half = head_dim // 2
        _rotary_kernel[(num_tokens,)](
            q, k, q_out, k_out, positions, cos_sin,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
            cos_sin.stride(0),
            num_q_heads, num_k_heads,
            HALF=half, BLOCK_HALF=pow2(half),
            BLOCK_HQ=pow2(num_q_heads), BLOCK_HK=pow2(num_k_heads),
            num_warps=4,
        )
    return q_out, k_out
