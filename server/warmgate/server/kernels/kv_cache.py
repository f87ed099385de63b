"""Write a step's new keys and values into the paged KV cache through slot_mapping."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from warmgate.server.kernels._launch import pow2, unit_stride_last


@triton.jit
def _reshape_and_cache_kernel(
    k_ptr, v_ptr, key_cache_ptr, value_cache_ptr, slot_mapping_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_cs, stride_ch,
    num_kv_heads,
    PAGE_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token)
    # A negative slot marks a token with nothing to cache (vLLM's convention).
    if slot < 0:
        return
    block = slot // PAGE_SIZE
    offset = slot % PAGE_SIZE
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < num_kv_heads) & (offs_d[None, :] < HEAD_DIM)  # [BLOCK_H, BLOCK_D]
    head_d = offs_h[:, None] * stride_ch + offs_d[None, :]
    dst = block * stride_cb + offset * stride_cs + head_d
    k = tl.load(k_ptr + token * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :],
                mask=mask)
    v = tl.load(v_ptr + token * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :],
                mask=mask)
    tl.store(key_cache_ptr + dst, k.to(key_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(value_cache_ptr + dst, v.to(value_cache_ptr.dtype.element_ty), mask=mask)


def reshape_and_cache(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                      slot_mapping: torch.Tensor) -> None:
    """k, v: [T, Hk, D]; kv_cache: [2, num_blocks, block_size, Hk, D]; slot_mapping: [T] int64.

    Token t goes to block slot_mapping[t] // block_size, offset slot_mapping[t] % block_size;
    tokens with a negative slot are skipped. Rows of k/v past len(slot_mapping) are ignored.
    """
    num_tokens = slot_mapping.shape[0]
    if num_tokens == 0:
        return
    _, _, block_size, num_kv_heads, head_dim = kv_cache.shape
    if k.shape[0] < num_tokens or v.shape[0] < num_tokens:
        raise ValueError(f"reshape_and_cache: {num_tokens} slots but k has {k.shape[0]} rows "
                         f"and v {v.shape[0]}")
    key_cache, value_cache = kv_cache[0], kv_cache[1]  # [num_blocks, block_size, Hk, D]
    if key_cache.stride(-1) != 1:
        raise ValueError("reshape_and_cache: the KV cache's head_dim must have unit stride")
    k = unit_stride_last(k)
    v = unit_stride_last(v)
    _reshape_and_cache_kernel[(num_tokens,)](
        k, v, key_cache, value_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        num_kv_heads,
        PAGE_SIZE=block_size, HEAD_DIM=head_dim,
        BLOCK_H=pow2(num_kv_heads), BLOCK_D=pow2(head_dim),
        num_warps=2,
    )
