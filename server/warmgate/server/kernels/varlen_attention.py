"""Paged attention for prefill and mixed batches: variable query lengths, causal.

Every key and value, the cached prefix and this step's new tokens alike, is read from the paged
cache (reshape_and_cache runs first), so a request with a cached prefix needs no special path.

A program holds BLOCK_M rows: BLOCK_Q = BLOCK_M // group consecutive query tokens times the
group query heads of one KV head (row r = token r // group, head r % group), so GQA heads
share each K/V tile.

Grid: (num_tokens // BLOCK_Q + num_reqs, num_kv_heads): a program for each query block a
request needs, each finding its request on the device (kernels/_query_blocks.py).

Decodes beside a prompt (a mixed step) get a launch of their own. A 128-row tile holds 32
tokens of a group of 4 heads, so a decode's one token used 4 of its rows: at 64 decodes of
512 keys beside a 1,024-token prompt, the 8B's varlen attention took 160 us a layer on an
H100, where reading those decodes' keys and values takes about 45. So requests of at most
SHORT_QUERY_LEN tokens (a decode, with up to three draft tokens) run in a second launch of
small tiles, one program a request and KV head, and the prompt launch skips them. Which
request is which is read on the device, so a CUDA graph of a ragged bucket replays both
launches whatever its requests turn out to be.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from warmgate.server.kernels._attention_tile import LOG2E, M_INIT, attend_range
from warmgate.server.kernels._launch import ieee_dots, pow2, prepare_paged_attention, upcast_dots
from warmgate.server.kernels._query_blocks import REQ_CHUNK, locate_block, query_block_programs

# The longest query the launch of small tiles takes: a decode with up to three draft tokens.
SHORT_QUERY_LEN = 4
# Which requests a launch attends for (its SELECT): every one, only those longer than
# SHORT_Q, or only the others, one program a request.
ALL, LONG, SHORT = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)


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
    SELECT: tl.constexpr, SHORT_Q: tl.constexpr,
):
    if SELECT == SHORT:  # BLOCK_Q >= SHORT_Q: one block holds a short request
        req = tl.program_id(0)
        q_block = 0
    else:
        req, q_block = locate_block(query_start_loc_ptr, num_reqs, tl.program_id(0), BLOCK_Q,
                                    REQ_CHUNK)
    kv_head = tl.program_id(1)
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    first = q_block * BLOCK_Q  # this program's first query token within the request
    # The query lengths this launch leaves to the other one (none for ALL).
    shorter = SHORT_Q if SELECT == LONG else 0
    longer = SHORT_Q if SELECT == SHORT else 2147483647
    if (first >= q_len) | (q_len <= shorter) | (q_len > longer):
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


def short_tile_rows(group: int, short_query_len: int) -> int:
    """Rows of the short launch's tile: short_query_len tokens of a group of heads, at least
    the 16 an MMA takes."""
    return max(16, pow2(group * short_query_len))


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
    short_query_len: int | None = None,
) -> torch.Tensor:
    """Causal attention for requests with any query lengths, K/V read from the paged cache.

    Request i's queries are rows query_start_loc[i]:query_start_loc[i+1], at positions
    seq_lens[i] - q_len_i .. seq_lens[i] - 1, within q's rows. max_query_len (a host int) at
    0 launches nothing; rows that no request owns are left untouched. num_reqs defaults to
    len(seq_lens). Requests of at most short_query_len tokens run in the launch of small
    tiles; None takes SHORT_QUERY_LEN where that tile is smaller than the prompts' (on the
    GPU), 0 one launch for all.
    """
    head_dim = q.shape[2]
    launch = prepare_paged_attention(q, kv_cache, seq_lens, num_reqs, out)
    q, out, num_reqs, group = launch.q, launch.out, launch.num_reqs, launch.group
    if num_reqs == 0 or max_query_len == 0:
        return out
    block_m, block_n, num_warps, num_stages = varlen_tiles(head_dim, q.dtype, q.is_cuda)
    block_m = max(block_m, pow2(group))  # at least one token's worth of heads per program
    if short_query_len is None:
        short = SHORT_QUERY_LEN
        short_query_len = short if short_tile_rows(group, short) < block_m else 0
    args = (q, launch.key_cache, launch.value_cache, block_table, seq_lens, query_start_loc, out,
            q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_table.stride(0),
            launch.key_cache.stride(0), launch.key_cache.stride(1), launch.key_cache.stride(2),
            scale * LOG2E, num_reqs)
    consts = dict(GROUP=group, BLOCK_N=block_n, HEAD_DIM=head_dim, BLOCK_D=pow2(head_dim, 16),
                  PAGE_SIZE=launch.block_size, UPCAST=upcast_dots(q), IEEE=ieee_dots(q.dtype),
                  REQ_CHUNK=REQ_CHUNK, SHORT_Q=short_query_len)
    if short_query_len == 0 or max_query_len > short_query_len:
        block_q = block_m // group
        grid = (query_block_programs(q.shape[0], num_reqs, block_q), launch.num_kv_heads)
        _varlen_kernel[grid](*args, BLOCK_M=block_m, BLOCK_Q=block_q,
                             SELECT=(LONG if short_query_len else ALL).value, num_warps=num_warps,
                             num_stages=num_stages, **consts)
    if short_query_len:
        short_m = short_tile_rows(group, short_query_len)
        # A few rows: fewer warps than the prompts' tiles. On sm_90 under Triton 3.6, four
        # warps at head_dim 64 put 8 bytes a thread on the stack and two at 128 took 255
        # registers (tests/varlen_spill_probe.py). Its work is the decode kernel's, a stream
        # of key tiles, so it takes that kernel's measured pipeline depth of two
        # (decode_attention._decode_config).
        _varlen_kernel[(num_reqs, launch.num_kv_heads)](
            *args, BLOCK_M=short_m, BLOCK_Q=short_m // group, SELECT=SHORT.value,
            num_warps=4 if head_dim > 64 else 2, num_stages=min(num_stages, 2), **consts)
    return out
