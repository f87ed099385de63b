"""Paged attention for prefill and mixed batches: variable query lengths, causal.

Every key and value, the cached prefix and this step's new tokens alike, is read from the paged
cache (reshape_and_cache runs first), so a request with a cached prefix needs no special path.

A program holds BLOCK_M rows: BLOCK_Q = BLOCK_M // group consecutive query tokens times the
group query heads of one KV head (row r = token r // group, head r % group), so GQA heads
share each K/V tile.

Grid: (num_tokens // BLOCK_Q + num_reqs, num_kv_heads): a program for each query block a
request needs, each finding its request on the device (kernels/_query_blocks.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from warmgate.server.kernels._attention_tile import LOG2E, M_INIT, attend_range
from warmgate.server.kernels._launch import ieee_dots, pow2, prepare_paged_attention, upcast_dots
from warmgate.server.kernels._query_blocks import REQ_CHUNK, locate_block, query_block_programs


@triton.jit(do_not_specialize=["num_reqs"])
def _varlen_kernel(
    q_ptr, key_cache_ptr, value_cache_ptr, block_table_ptr, seq_lens_ptr, query_start_loc_ptr,
    out_ptr,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_bt,
    stride_cb, stride_cs, stride_ch,
    qk_scale, num_reqs,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAGE_SIZE: tl.constexpr,
    UPCAST: tl.constexpr, IEEE: tl.constexpr, REQ_CHUNK: tl.constexpr,
):
    req, q_block = locate_block(query_start_loc_ptr, num_reqs, tl.program_id(0), BLOCK_Q,
                                REQ_CHUNK)
    kv_head = tl.program_id(1)
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    first = q_block * BLOCK_Q  # this program's first query token within the request
    if first >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + req)
    context_len = seq_len - q_len  # tokens cached before this step

    offs_m = tl.arange(0, BLOCK_M)
    local = offs_m // GROUP
    head = kv_head * GROUP + offs_m % GROUP
    tq = first + local  # [BLOCK_M] query token index within the request
    row_mask = (local < BLOCK_Q) & (tq < q_len)
    q_pos = context_len + tq
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    token = (q_start + tq).to(tl.int64)
    io_mask = row_mask[:, None] & d_mask[None, :]
    q = tl.load(q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=io_mask, other=0.0)  # [BLOCK_M, BLOCK_D]

    # Keys up to the last query of this tile; causal masking only near the diagonal.
    hi = context_len + tl.minimum(first + BLOCK_Q, q_len)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], M_INIT, dtype=tl.float32)
    acc, l_i, m_i = attend_range(
        acc, l_i, m_i, q, q_pos, context_len + first,
        key_cache_ptr, value_cache_ptr, block_table_ptr + req.to(tl.int64) * stride_bt,
        0, hi, kv_head, offs_d, d_mask, stride_cb, stride_cs, stride_ch, qk_scale,
        BLOCK_N=BLOCK_N, PAGE_SIZE=PAGE_SIZE, UPCAST=UPCAST, IEEE=IEEE)

    o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    dst = token[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
    tl.store(out_ptr + dst, o.to(out_ptr.dtype.element_ty), mask=io_mask)


def varlen_tiles(head_dim: int, dtype: torch.dtype, on_gpu: bool) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages). Prefill is compute-bound: 128-row tiles
    (the flash-attention shape for Hopper-class mma) with 64-key tiles; head_dim 128 doubles
    the warps to hold the larger accumulator. float32 and wide heads shrink the tiles to fit
    shared memory. The interpreter gets 16x16 tiles so tiny tests cross every boundary."""
    if not on_gpu:
        return 16, 16, 4, 1
    if dtype == torch.float32 or head_dim > 128:
        return 64, 32, 4, 2
    if head_dim <= 64:
        return 128, 64, 4, 3
    return 128, 64, 8, 3


def paged_attention_varlen(
    q: torch.Tensor,  # [T, Hq, D]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, Hk, D]
    block_table: torch.Tensor,  # [num_reqs, max_blocks_per_req] int32
    seq_lens: torch.Tensor,  # [num_reqs] int32, including this step's tokens
    query_start_loc: torch.Tensor,  # [num_reqs + 1] int32
    *,
    scale: float,
    max_query_len: int,
    out: torch.Tensor | None = None,  # [T, Hq, D]
    num_reqs: int | None = None,
) -> torch.Tensor:
    """Causal attention for requests with any query lengths, K/V read from the paged cache.

    Request i's queries are rows query_start_loc[i]:query_start_loc[i+1], at positions
    seq_lens[i] - q_len_i .. seq_lens[i] - 1, within q's rows. max_query_len (a host int) at
    0 launches nothing; rows that no request owns are left untouched. num_reqs defaults to
    len(seq_lens).
    """
    head_dim = q.shape[2]
    launch = prepare_paged_attention(q, kv_cache, seq_lens, num_reqs, out)
    q, out, num_reqs, group = launch.q, launch.out, launch.num_reqs, launch.group
    if num_reqs == 0 or max_query_len == 0:
        return out
    key_cache, value_cache = launch.key_cache, launch.value_cache
    block_size, num_kv_heads = launch.block_size, launch.num_kv_heads
    block_m, block_n, num_warps, num_stages = varlen_tiles(head_dim, q.dtype, q.is_cuda)
    block_m = max(block_m, pow2(group))  # at least one token's worth of heads per program
    block_q = block_m // group
    grid = (query_block_programs(q.shape[0], num_reqs, block_q), num_kv_heads)
    _varlen_kernel[grid](
        q, key_cache, value_cache, block_table, seq_lens, query_start_loc, out,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_table.stride(0),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        scale * LOG2E, num_reqs,
        GROUP=group, BLOCK_M=block_m, BLOCK_Q=block_q, BLOCK_N=block_n, HEAD_DIM=head_dim,
        BLOCK_D=pow2(head_dim, 16), PAGE_SIZE=block_size,
        UPCAST=upcast_dots(q), IEEE=ieee_dots(q.dtype), REQ_CHUNK=REQ_CHUNK,
        num_warps=num_warps, num_stages=num_stages,
    )
    return out
