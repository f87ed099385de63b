"""The rotary embedding and the KV-cache write inside the decode kernel (kernels/decode_attention.py
with a DecodeRope): a uniform decode step's layers run no rope-and-cache launch of their own.

The decode kernel then reads the step's unrotated q, k and v from the fused projection:
- every program rotates its own query rows (after Qwen3's per-head RMSNorm, when given);
- the step's own keys are not read back from the cache: the program whose key range holds them
  rotates them, attends to them after the cached keys (they are the last positions, so the
  key order is the same as reading them from the cache), and writes them and their values
  into the cache for later steps. No program reads a cache row another program writes in the
  same launch, so no ordering between programs is needed.

The arithmetic is kernels/rope_cache.py's: the "rotate half" layout, float32 cos/sin from
runner.ops.build_cos_sin_cache, q rounded to its dtype and k and v to the cache's, the norm's
output rounded to the activation dtype before the rotation. A row is held whole here, its
partner lanes (i + D/2 for the first half, i - D/2 for the second) loaded beside it, so the
norm's sum of squares is one reduction over the row where rope_cache adds two halves' sums.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from warmgate.server.kernels._attention_tile import mm, online_softmax
from warmgate.server.kernels._launch import pow2, unit_stride_last
from warmgate.server.kernels.rope_cache import check_rotation


@dataclass(frozen=True)
class DecodeRope:
    """What paged_attention_decode needs to rotate q and k and write the cache itself (the
    arguments of kernels.rope_cache.rope_and_cache but the cache and q, which it has)."""

    k: torch.Tensor  # [T, Hk, D], unit stride in D (a view of the fused projection is fine)
    v: torch.Tensor  # [T, Hk, D]
    positions: torch.Tensor  # [T] int64
    cos_sin_cache: torch.Tensor  # [max_pos, D] float32, cos then sin
    slot_mapping: torch.Tensor  # [S] int64, S <= T; a negative slot or t >= S writes nothing
    q_norm_weight: torch.Tensor | None = None  # [D], with k_norm_weight and eps (Qwen3)
    k_norm_weight: torch.Tensor | None = None
    eps: float | None = None


@triton.jit
def rope_rows(src_ptr, row_off, row_mask, offs_d, d_mask, pos, cos_sin_ptr, stride_cs,
              norm_w_ptr, eps, HALF: tl.constexpr, QK_NORM: tl.constexpr):
    """R whole head rows at src_ptr + row_off [R] (int64 element offsets), normalised first with
    QK_NORM (norm_w_ptr [D], eps), rotated by pos [R]: float32 [R, BLOCK_D], masked lanes 0."""
    mask = row_mask[:, None] & d_mask[None, :]
    first = offs_d < HALF
    partner = tl.where(first, offs_d + HALF, offs_d - HALF)
    rows = src_ptr + row_off[:, None]
    x = tl.load(rows + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    xp = tl.load(rows + partner[None, :], mask=mask, other=0.0).to(tl.float32)
    if QK_NORM:
        rstd = (1.0 / tl.sqrt(tl.sum(x * x, axis=1) / (2 * HALF) + eps))[:, None]
        w = tl.load(norm_w_ptr + offs_d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
        wp = tl.load(norm_w_ptr + partner, mask=d_mask, other=0.0).to(tl.float32)[None, :]
        act_ty = src_ptr.dtype.element_ty
        x = (x * rstd * w).to(act_ty).to(tl.float32)
        xp = (xp * rstd * wp).to(act_ty).to(tl.float32)
    # The cos/sin row holds cos in its first half and sin in its second.
    angle = cos_sin_ptr + pos.to(tl.int64)[:, None] * stride_cs + tl.where(
        first, offs_d, offs_d - HALF)[None, :]
    cos = tl.load(angle, mask=mask, other=0.0)
    sin = tl.load(angle + HALF, mask=mask, other=0.0)
    return tl.where(first[None, :], x * cos - xp * sin, x * cos + xp * sin)


@triton.jit
def attend_new_keys(
    acc, l_i, m_i, q, q_pos,
    k_ptr, v_ptr, key_cache_ptr, value_cache_ptr, positions_ptr, cos_sin_ptr, slot_mapping_ptr,
    k_norm_ptr, eps, num_slots, q_start, q_len, first_key, lo, hi, kv_head, offs_d, d_mask,
    stride_kt, stride_kh, stride_vt, stride_vh, stride_cos, stride_cb, stride_cs, stride_ch,
    qk_scale,
    NEW_N: tl.constexpr, HALF: tl.constexpr, PAGE_SIZE: tl.constexpr, QK_NORM: tl.constexpr,
    UPCAST: tl.constexpr, IEEE: tl.constexpr,
):
    """One online-softmax tile over this step's keys that fall in [lo, hi): key j of the
    request is token q_start + j at position first_key + j (j < q_len). They are rotated,
    rounded to the cache's dtype, written into the cache at their slots and attended."""
    j = tl.arange(0, NEW_N)
    key_pos = first_key + j
    mine = (j < q_len) & (key_pos >= lo) & (key_pos < hi)
    token = (q_start + j).to(tl.int64)
    pos = tl.load(positions_ptr + token, mask=mine, other=0)
    c_ty = key_cache_ptr.dtype.element_ty
    k = rope_rows(k_ptr, token * stride_kt + kv_head * stride_kh, mine, offs_d, d_mask, pos,
                  cos_sin_ptr, stride_cos, k_norm_ptr, eps, HALF, QK_NORM).to(c_ty)
    kv_mask = mine[:, None] & d_mask[None, :]
    v = tl.load(v_ptr + (token * stride_vt + kv_head * stride_vh)[:, None] + offs_d[None, :],
                mask=kv_mask, other=0.0).to(c_ty)
    slot = tl.load(slot_mapping_ptr + token, mask=mine & (token < num_slots), other=-1)
    cache_off = ((slot // PAGE_SIZE) * stride_cb + (slot % PAGE_SIZE) * stride_cs
                 + kv_head * stride_ch)[:, None] + offs_d[None, :]
    write = kv_mask & (slot >= 0)[:, None]
    tl.store(key_cache_ptr + cache_off, k, mask=write)
    tl.store(value_cache_ptr + cache_off, v, mask=write)
    qk = mm(q, tl.trans(k), UPCAST, IEEE) * qk_scale  # [BLOCK_M, NEW_N]
    visible = mine[None, :] & (key_pos[None, :] <= q_pos[:, None])
    p, alpha, l_i, m_i = online_softmax(l_i, m_i, qk, visible)
    acc = acc * alpha[:, None] + mm(p.to(v.dtype), v, UPCAST, IEEE)
    return acc, l_i, m_i


def rope_launch_args(rope: DecodeRope | None, q: torch.Tensor, key_cache: torch.Tensor,
                     query_len: int) -> tuple[tuple, dict]:
    """The decode kernel's rope arguments: (k .. k_norm pointers, their strides, num_slots
    and eps; the constexprs). Without a rope every pointer is q, never read (ROPE=False)."""
    if rope is None:
        return ((q,) * 7 + (0,) * 5 + (0, 0.0),
                dict(ROPE=False, QK_NORM=False, NEW_N=16))
    num_tokens, _, head_dim = q.shape
    qk_norm = check_rotation("paged_attention_decode", head_dim, rope.cos_sin_cache,
                             rope.q_norm_weight, rope.k_norm_weight, rope.eps)
    k, v = unit_stride_last(rope.k), unit_stride_last(rope.v)
    num_slots = rope.slot_mapping.shape[0]
    if (k.shape != v.shape or k.shape[0] < num_slots or k.shape[1:] != key_cache.shape[2:]
            or rope.positions.shape[0] < num_tokens or k.shape[0] < num_tokens):
        raise ValueError(f"paged_attention_decode: q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}, {rope.positions.shape[0]} positions and "
                         f"{num_slots} slots for a cache of [.., {key_cache.shape[2]}, "
                         f"{key_cache.shape[3]}] heads")
    cos_sin = unit_stride_last(rope.cos_sin_cache.to(torch.float32))
    # Without the norm its weight pointers are never read (QK_NORM is a constexpr).
    q_norm = rope.q_norm_weight if qk_norm else q
    k_norm = rope.k_norm_weight if qk_norm else q
    return ((k, v, rope.positions, cos_sin, rope.slot_mapping, q_norm, k_norm,
             k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos_sin.stride(0),
             num_slots, rope.eps if qk_norm else 0.0),
            dict(ROPE=True, QK_NORM=qk_norm, NEW_N=pow2(query_len, 16)))
