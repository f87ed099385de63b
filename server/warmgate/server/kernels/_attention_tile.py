"""The inner step both paged-attention kernels share: one KV tile of online softmax.

A program owns BLOCK_M query rows that all read the same KV head (GQA: the query heads of one
KV head, and for decode also the drafts of one request), so each K/V tile is loaded once for
all of them. Scores live in the log2 domain (the scale is pre-multiplied by log2(e)) so the
softmax uses exp2.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634
# The running max starts finite so that rows which have seen only masked keys get
# exp2(-inf - m) = 0 rather than exp2(-inf + inf) = NaN. (A constexpr: compiled kernels may
# read no other kind of global.)
M_INIT = tl.constexpr(-1.0e30)


@triton.jit
def mm(a, b, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    """a @ b with float32 accumulation; see _launch.upcast_dots / ieee_dots for the flags.

    UPCAST means the Triton interpreter, whose tl.dot is the host BLAS's matrix product: its
    kernels may sum a row's products in an order that depends on the row's place in the tile
    (OpenBLAS on AMD Zen does), so a row's result would depend on the rows beside it, as it
    never does on the GPU's tensor cores. The products summed along K one by one give every
    row the same order wherever it sits."""
    if UPCAST:
        return tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
    return tl.dot(a, b, input_precision="ieee") if IEEE else tl.dot(a, b)


@triton.jit
def attend_kv_tile(
    acc, l_i, m_i,  # [BLOCK_M, BLOCK_D] f32, [BLOCK_M] f32, [BLOCK_M] f32
    q,  # [BLOCK_M, BLOCK_D], input dtype
    q_pos,  # [BLOCK_M] int32: each row's position, for the causal mask
    key_cache_ptr, value_cache_ptr, block_table_row_ptr,
    start_n, kv_end, kv_head, offs_d, d_mask,
    stride_cb, stride_cs, stride_ch, qk_scale,
    BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, CAUSAL: tl.constexpr,
    UPCAST: tl.constexpr, IEEE: tl.constexpr,
):
    offs_n = start_n + tl.arange(0, BLOCK_N)  # [BLOCK_N] key positions
    n_mask = offs_n < kv_end
    # A tile may span several pages: look each key's page up in the block table.
    page = tl.load(block_table_row_ptr + offs_n // PAGE_SIZE, mask=n_mask, other=0)
    kv_off = (page.to(tl.int64) * stride_cb + (offs_n % PAGE_SIZE) * stride_cs
              + kv_head * stride_ch)  # [BLOCK_N]
    kv_mask = n_mask[:, None] & d_mask[None, :]  # [BLOCK_N, BLOCK_D]
    k = tl.load(key_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    qk = mm(q, tl.trans(k), UPCAST, IEEE) * qk_scale  # [BLOCK_M, BLOCK_N]
    visible = n_mask[None, :]
    if CAUSAL:
        visible = visible & (offs_n[None, :] <= q_pos[:, None])
    qk = tl.where(visible, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new[:, None])  # [BLOCK_M, BLOCK_N]
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(value_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    acc = acc * alpha[:, None] + mm(p.to(v.dtype), v, UPCAST, IEEE)
    return acc, l_i, m_new


@triton.jit
def attend_range(
    acc, l_i, m_i, q, q_pos, first_pos,
    key_cache_ptr, value_cache_ptr, block_table_row_ptr,
    lo, hi, kv_head, offs_d, d_mask,
    stride_cb, stride_cs, stride_ch, qk_scale,
    BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
    UPCAST: tl.constexpr, IEEE: tl.constexpr,
):
    """Attend over keys [lo, hi) (lo a multiple of BLOCK_N); first_pos is the smallest q_pos.

    Whole tiles at or before first_pos are visible to every row and skip the causal mask;
    only the tiles after it (the diagonal) pay for it.
    """
    mid = ((first_pos + 1) // BLOCK_N) * BLOCK_N
    mid = tl.minimum(tl.maximum(mid, lo), hi)
    for start_n in range(lo, mid, BLOCK_N):
        acc, l_i, m_i = attend_kv_tile(
            acc, l_i, m_i, q, q_pos, key_cache_ptr, value_cache_ptr, block_table_row_ptr,
            start_n, hi, kv_head, offs_d, d_mask, stride_cb, stride_cs, stride_ch, qk_scale,
            BLOCK_N=BLOCK_N, PAGE_SIZE=PAGE_SIZE, CAUSAL=False, UPCAST=UPCAST, IEEE=IEEE)
    for start_n in range(mid, hi, BLOCK_N):
        acc, l_i, m_i = attend_kv_tile(
            acc, l_i, m_i, q, q_pos, key_cache_ptr, value_cache_ptr, block_table_row_ptr,
            start_n, hi, kv_head, offs_d, d_mask, stride_cb, stride_cs, stride_ch, qk_scale,
            BLOCK_N=BLOCK_N, PAGE_SIZE=PAGE_SIZE, CAUSAL=True, UPCAST=UPCAST, IEEE=IEEE)
    return acc, l_i, m_i
