"""The rotary embedding and the KV-cache write inside the decode kernel (kernels/decode_attention.py
with a DecodeRope): a uniform decode step's layers run no rope-and-cache launch of their own.

The decode kernel then reads the step's unrotated q, k and v from the fused projection:
- every program rotates its own query rows (after Qwen3's per-head RMSNorm, when given);
- the program whose key range holds this step's keys rotates them and writes them and their
  values into the cache, then reads them back with the cached keys before them. Each key
  position is one split's, so no other program of the launch reads those cache rows: a
  barrier among the program's own threads orders the write before the read. (Attending to
  them from registers instead, as a tile of their own, took the kernel past 255 registers
  with spills on sm_90: tests/test_decode_spills.py.)

The arithmetic is kernels/rope_cache.py's, in the same halves (the rotation pairs element i
with i + D/2) and the same order, so k and v reach the cache as the same bits: the "rotate
half" layout, float32 cos/sin from runner.ops.build_cos_sin_cache, q rounded to its dtype and
k and v to the cache's, the norm's output rounded to the activation dtype before the
rotation. (The attention's output differed by a bf16 ulp in a few elements on an H100:
tests/gpu/test_decode_rope_gpu.py.) The kernel then joins q's two halves into whole rows,
which needs a power-of-two head_dim (a half of 64 lanes is a row's first 64 lanes): for any
other, the backend keeps the separate rope-and-cache launch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from warmgate.server.kernels._launch import pow2, unit_stride_last
from warmgate.server.kernels._rope_norm import rms_norm_heads
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
def rope_halves(src_ptr, row_off, row_mask, offs_h, h_mask, pos, cos_sin_ptr, stride_cs,
                norm_w_ptr, eps, HALF: tl.constexpr, QK_NORM: tl.constexpr):
    """R head rows at src_ptr + row_off [R] (int64 element offsets), normalised first with
    QK_NORM (norm_w_ptr [D], eps), rotated by pos [R]: their two float32 halves
    [R, BLOCK_HALF] (masked lanes 0), rope_cache's arithmetic to the bit."""
    mask = row_mask[:, None] & h_mask[None, :]
    src = src_ptr + row_off[:, None] + offs_h[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    if QK_NORM:
        x1, x2 = rms_norm_heads(x1, x2, norm_w_ptr, src_ptr, offs_h, h_mask, eps, HALF)
    # The cos/sin row holds cos in its first half and sin in its second.
    angle = cos_sin_ptr + pos.to(tl.int64)[:, None] * stride_cs + offs_h[None, :]
    cos = tl.load(angle, mask=mask, other=0.0)
    sin = tl.load(angle + HALF, mask=mask, other=0.0)
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin


@triton.jit
def rotated_rows(src_ptr, row_off, row_mask, pos, cos_sin_ptr, stride_cs, norm_w_ptr, eps,
                 out_ty: tl.constexpr, ROWS: tl.constexpr, HALF: tl.constexpr,
                 QK_NORM: tl.constexpr):
    """rope_halves' rows whole, [ROWS, 2 * HALF] in out_ty (HALF a power of two, so the
    halves side by side are the row's own lanes)."""
    offs_h = tl.arange(0, HALF)
    r1, r2 = rope_halves(src_ptr, row_off, row_mask, offs_h, offs_h < HALF, pos, cos_sin_ptr,
                         stride_cs, norm_w_ptr, eps, HALF, QK_NORM)
    both = tl.join(r1.to(out_ty), r2.to(out_ty))  # [ROWS, HALF, 2]
    return tl.reshape(tl.permute(both, (0, 2, 1)), (ROWS, 2 * HALF))


@triton.jit
def cache_new_keys(
    k_ptr, v_ptr, key_cache_ptr, value_cache_ptr, positions_ptr, cos_sin_ptr, slot_mapping_ptr,
    k_norm_ptr, eps, num_slots, q_start, q_len, first_key, lo, hi, kv_head,
    stride_kt, stride_kh, stride_vt, stride_vh, stride_cos, stride_cb, stride_cs, stride_ch,
    NEW_N: tl.constexpr, HALF: tl.constexpr, PAGE_SIZE: tl.constexpr, QK_NORM: tl.constexpr,
):
    """Rotate this step's keys that fall in [lo, hi) and write them and their values into
    the cache: key j of the request is token q_start + j at position first_key + j
    (j < q_len), rounded to the cache's dtype as rope_and_cache writes it."""
    j = tl.arange(0, NEW_N)
    key_pos = first_key + j
    mine = (j < q_len) & (key_pos >= lo) & (key_pos < hi)
    token = (q_start + j).to(tl.int64)
    pos = tl.load(positions_ptr + token, mask=mine, other=0)
    slot = tl.load(slot_mapping_ptr + token, mask=mine & (token < num_slots), other=-1)
    write = mine & (slot >= 0)
    offs_h = tl.arange(0, HALF)
    k1, k2 = rope_halves(k_ptr, token * stride_kt + kv_head * stride_kh, write, offs_h,
                         offs_h < HALF, pos, cos_sin_ptr, stride_cos, k_norm_ptr, eps, HALF,
                         QK_NORM)
    c_ty = key_cache_ptr.dtype.element_ty
    mask = write[:, None]
    dst = ((slot // PAGE_SIZE) * stride_cb + (slot % PAGE_SIZE) * stride_cs
           + kv_head * stride_ch)[:, None] + offs_h[None, :]
    tl.store(key_cache_ptr + dst, k1.to(c_ty), mask=mask)
    tl.store(key_cache_ptr + dst + HALF, k2.to(c_ty), mask=mask)
    v = v_ptr + (token * stride_vt + kv_head * stride_vh)[:, None] + offs_h[None, :]
    tl.store(value_cache_ptr + dst, tl.load(v, mask=mask, other=0.0).to(c_ty), mask=mask)
    tl.store(value_cache_ptr + dst + HALF, tl.load(v + HALF, mask=mask, other=0.0).to(c_ty),
             mask=mask)


def rotates_in_decode(head_dim: int) -> bool:
    """Whether the decode kernel can rotate heads of head_dim (see the module docstring)."""
    return head_dim >= 2 and head_dim & (head_dim - 1) == 0


class RopeLaunch(NamedTuple):
    """The decode kernel's rope arguments, in the places its signature takes them."""

    pointers: tuple  # k, v, positions, cos_sin, slot_mapping, q_norm, k_norm
    strides: tuple  # stride_kt, stride_kh, stride_vt, stride_vh, stride_cos
    scalars: tuple  # num_slots, eps
    flags: dict  # ROPE, QK_NORM, NEW_N


def rope_launch_args(rope: DecodeRope | None, q: torch.Tensor, key_cache: torch.Tensor,
                     query_len: int) -> RopeLaunch:
    """The decode kernel's rope arguments. Without a rope every pointer is q, never read
    (ROPE=False)."""
    if rope is None:
        return RopeLaunch((q,) * 7, (0,) * 5, (0, 0.0),
                          dict(ROPE=False, QK_NORM=False, NEW_N=1))
    num_tokens, _, head_dim = q.shape
    qk_norm = check_rotation("paged_attention_decode", head_dim, rope.cos_sin_cache,
                             rope.q_norm_weight, rope.k_norm_weight, rope.eps)
    if not rotates_in_decode(head_dim):
        raise ValueError(f"paged_attention_decode: head_dim {head_dim} is not a power of two: "
                         "rotate with rope_and_cache first")
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
    return RopeLaunch((k, v, rope.positions, cos_sin, rope.slot_mapping, q_norm, k_norm),
                      (k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos_sin.stride(0)),
                      (num_slots, rope.eps if qk_norm else 0.0),
                      dict(ROPE=True, QK_NORM=qk_norm, NEW_N=pow2(query_len)))
