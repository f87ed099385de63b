"""Rotary embedding and the KV-cache write in one launch: the attention input of every layer.

Before this kernel a layer ran the rotary kernel (read q, k; write rotated copies), then the
cache write (read k, v again; write the cache) - and FlashInfer's decode also wanted q
contiguous, a third copy. One program per token now reads q, k and v once from the fused qkv
projection, rotates q into a dense output and writes the rotated k and v straight into the
paged cache. On the H200 the three steps cost 70 + 50..180 us per decode step on llama-3.1-8b
(bench/results/h200-step-kernels.txt), about a quarter of attention's own time at batch 1.

The rotation is the "rotate half" (NeoX / Llama) layout with the cos/sin cache built by
runner.ops.build_cos_sin_cache, in float32 as TorchOps.rotary computes it, so q and the cached
k round exactly once, to the same values the separate kernels produced.

Qwen3 RMS-normalises every q and k head over head_dim before the rotation: given the norm
weights (QK_NORM, a constexpr, so other models compile the variant without it) the program
normalises the heads it has just loaded (kernels._rope_norm) instead of two more launches per
layer that each read and wrote q or k. The normalised values are rounded to the activation
dtype before they are rotated, as the separate norm's output was, so the result differs from
norm-then-rotate only where the sum of squares, taken here as two halves, rounds apart.
"""

from __future__ import annotations

from typing import Literal

import torch
import triton
import triton.language as tl

from warmgate.server.kernels._launch import pow2, unit_stride_last
from warmgate.server.kernels._rope_norm import rms_norm_heads
from warmgate.server.kernels.pdl import launch_args, pdl_release, pdl_wait

# How a [num_blocks, ...] cache orders a page's slots and KV heads: NHD [page slot, head, D]
# (ours and FlashInfer's "NHD"), HND [head, page slot, D] (FlashInfer's "HND").
CacheLayout = Literal["NHD", "HND"]


# num_slots follows the batch: specialising on it (== 1, divisible by 16) would compile new
# variants for token counts the warmup never ran.
@triton.jit(do_not_specialize=["num_slots"])
def _rope_cache_kernel(
    q_ptr, k_ptr, v_ptr, q_out_ptr, key_cache_ptr, value_cache_ptr,
    positions_ptr, cos_sin_ptr, slot_mapping_ptr, q_norm_ptr, k_norm_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_qot, stride_qoh, stride_cs,
    stride_cb, stride_cslot, stride_ch,
    num_q_heads, num_kv_heads, num_slots, eps,
    PAGE_SIZE: tl.constexpr, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, QK_NORM: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    pdl_wait(USE_PDL)  # q, k, v are the projection's output; the positions the step's input
    pos = tl.load(positions_ptr + token)
    # Rows past the slot mapping (graph padding beyond the batch) and negative slots have
    # nothing to cache; their q is still rotated, as the separate rotary kernel did.
    slot = tl.load(slot_mapping_ptr + token, mask=token < num_slots, other=-1)
    offs_d = tl.arange(0, BLOCK_HALF)
    d_mask = offs_d < HALF
    # The cache row holds cos in its first half and sin in its second.
    cos = tl.load(cos_sin_ptr + pos * stride_cs + offs_d, mask=d_mask, other=0.0)[None, :]
    sin = tl.load(cos_sin_ptr + pos * stride_cs + HALF + offs_d, mask=d_mask, other=0.0)[None, :]

    offs_hq = tl.arange(0, BLOCK_HQ)
    q_mask = (offs_hq[:, None] < num_q_heads) & d_mask[None, :]  # [BLOCK_HQ, BLOCK_HALF]
    src = q_ptr + token * stride_qt + offs_hq[:, None] * stride_qh + offs_d[None, :]
    q1 = tl.load(src, mask=q_mask, other=0.0).to(tl.float32)
    q2 = tl.load(src + HALF, mask=q_mask, other=0.0).to(tl.float32)
    pdl_release(USE_PDL)
    if QK_NORM:  # Qwen3: every head RMS-normalised over D before it is rotated
        q1, q2 = rms_norm_heads(q1, q2, q_norm_ptr, q_ptr, offs_d, d_mask, eps, HALF)
    dst = q_out_ptr + token * stride_qot + offs_hq[:, None] * stride_qoh + offs_d[None, :]
    q_ty = q_out_ptr.dtype.element_ty
    tl.store(dst, (q1 * cos - q2 * sin).to(q_ty), mask=q_mask)
    tl.store(dst + HALF, (q2 * cos + q1 * sin).to(q_ty), mask=q_mask)

    offs_hk = tl.arange(0, BLOCK_HK)
    # The slot test as a vector: the interpreter cannot broadcast a scalar mask.
    has_slot = (offs_hk * 0 + slot) >= 0  # [BLOCK_HK]
    kv_mask = (offs_hk[:, None] < num_kv_heads) & has_slot[:, None] & d_mask[None, :]
    block = slot // PAGE_SIZE
    cache_off = (block * stride_cb + (slot % PAGE_SIZE) * stride_cslot
                 + offs_hk[:, None] * stride_ch + offs_d[None, :])  # [BLOCK_HK, BLOCK_HALF]
    k_src = k_ptr + token * stride_kt + offs_hk[:, None] * stride_kh + offs_d[None, :]
    k1 = tl.load(k_src, mask=kv_mask, other=0.0).to(tl.float32)
    k2 = tl.load(k_src + HALF, mask=kv_mask, other=0.0).to(tl.float32)
    if QK_NORM:
        k1, k2 = rms_norm_heads(k1, k2, k_norm_ptr, k_ptr, offs_d, d_mask, eps, HALF)
    c_ty = key_cache_ptr.dtype.element_ty
    tl.store(key_cache_ptr + cache_off, (k1 * cos - k2 * sin).to(c_ty), mask=kv_mask)
    tl.store(key_cache_ptr + cache_off + HALF, (k2 * cos + k1 * sin).to(c_ty), mask=kv_mask)
    v_src = v_ptr + token * stride_vt + offs_hk[:, None] * stride_vh + offs_d[None, :]
    v1 = tl.load(v_src, mask=kv_mask, other=0.0)
    v2 = tl.load(v_src + HALF, mask=kv_mask, other=0.0)
    tl.store(value_cache_ptr + cache_off, v1.to(c_ty), mask=kv_mask)
    tl.store(value_cache_ptr + cache_off + HALF, v2.to(c_ty), mask=kv_mask)


def _cache_strides(cache: torch.Tensor, layout: CacheLayout) -> tuple[int, int, int]:
    """(block, page slot, KV head) strides of one [num_blocks, ...] cache half."""
    if cache.dim() != 4 or cache.stride(-1) != 1:
        raise ValueError(f"rope_and_cache: a cache half must be 4-D with unit stride in "
                         f"head_dim, got shape {tuple(cache.shape)} strides {cache.stride()}")
    if layout == "NHD":
        return cache.stride(0), cache.stride(1), cache.stride(2)
    if layout == "HND":
        return cache.stride(0), cache.stride(2), cache.stride(1)
    raise ValueError(f"rope_and_cache: layout must be 'NHD' or 'HND', got {layout!r}")


def check_rotation(who: str, head_dim: int, cos_sin_cache: torch.Tensor,
                   q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
                   eps: float | None) -> bool:
    """Refuse a rotation the kernels cannot apply (an odd head_dim, a cos/sin cache of another
    width, a partial or misshapen q/k norm set); True when the heads are normalised too."""
    if head_dim % 2 or cos_sin_cache.shape[-1] != head_dim:
        raise ValueError(f"{who}: head_dim {head_dim} must be even and match the "
                         f"cos/sin cache width {cos_sin_cache.shape[-1]}")
    if q_weight is None and k_weight is None and eps is None:
        return False
    if q_weight is None or k_weight is None or eps is None:
        raise ValueError(f"{who}: q_norm_weight, k_norm_weight and eps come together, "
                         f"got q_norm_weight={q_weight is not None}, "
                         f"k_norm_weight={k_weight is not None}, eps={eps}")
    for name, weight in (("q_norm_weight", q_weight), ("k_norm_weight", k_weight)):
        if weight.shape != (head_dim,) or weight.stride(0) != 1:
            raise ValueError(f"{who}: {name} must be a dense [{head_dim}] vector, "
                             f"got shape {tuple(weight.shape)} strides {weight.stride()}")
    return True


def rope_and_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                   key_cache: torch.Tensor, value_cache: torch.Tensor,
                   slot_mapping: torch.Tensor, *, layout: CacheLayout = "NHD",
                   q_out: torch.Tensor | None = None,
                   q_norm_weight: torch.Tensor | None = None,
                   k_norm_weight: torch.Tensor | None = None,
                   eps: float | None = None) -> torch.Tensor:
    """Rotate q and k by `positions`, write the rotated k and v into the paged cache.

    q: [T, Hq, D]; k, v: [T, Hk, D] (views of the fused qkv projection are fine: only the
    last dimension needs unit stride); positions: [T] int64; cos_sin_cache: [max_pos, D]
    float32, cos then sin. key_cache, value_cache: [num_blocks, block_size, Hk, D] (NHD) or
    [num_blocks, Hk, block_size, D] (HND). slot_mapping: [S] int64, S <= T: token t goes to
    block slot // block_size, offset slot % block_size; a negative slot, or t >= S, writes
    nothing. Returns the rotated q, dense [T, Hq, D] (`q_out` when given).
    q_norm_weight, k_norm_weight: [D] each, with `eps` (all three or none): every head of q
    and of k is RMS-normalised over D and scaled by its weight first, rounded to q's and k's
    dtype, as the separate per-head norm (kernels.rms_norm) writes it.
    No host sync: safe under CUDA-graph capture.
    """
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    qk_norm = check_rotation("rope_and_cache", head_dim, cos_sin_cache, q_norm_weight,
                             k_norm_weight, eps)
    num_slots = slot_mapping.shape[0]
    if k.shape[0] < num_slots or v.shape[0] < num_slots or positions.shape[0] < num_tokens:
        raise ValueError(f"rope_and_cache: {num_tokens} tokens and {num_slots} slots but k has "
                         f"{k.shape[0]} rows, v {v.shape[0]}, positions {positions.shape[0]}")
    stride_cb, stride_cslot, stride_ch = _cache_strides(key_cache, layout)
    if value_cache.stride() != key_cache.stride() or value_cache.shape != key_cache.shape:
        raise ValueError("rope_and_cache: the key and value caches must share shape and strides")
    page_size = key_cache.shape[1] if layout == "NHD" else key_cache.shape[2]
    q, k, v = unit_stride_last(q), unit_stride_last(k), unit_stride_last(v)
    cos_sin = unit_stride_last(cos_sin_cache.to(torch.float32))  # [max_pos, D]
    if q_out is None:
        q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # [T, Hq, D]
    if num_tokens > 0:
        half = head_dim // 2
        _rope_cache_kernel[(num_tokens,)](
            q, k, v, q_out, key_cache, value_cache, positions, cos_sin, slot_mapping,
            # Without the norm the weight pointers are never read (QK_NORM is a constexpr).
            q_norm_weight if qk_norm else q, k_norm_weight if qk_norm else k,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            q_out.stride(0), q_out.stride(1), cos_sin.stride(0),
            stride_cb, stride_cslot, stride_ch,
            num_q_heads, num_kv_heads, num_slots, eps if qk_norm else 0.0,
            PAGE_SIZE=page_size, HALF=half, BLOCK_HALF=pow2(half),
            BLOCK_HQ=pow2(num_q_heads), BLOCK_HK=pow2(num_kv_heads), QK_NORM=qk_norm,
            num_warps=4, **launch_args(q),
        )
    return q_out
