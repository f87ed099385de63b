"""Paged attention for --deterministic: every batch (prefill, chunked prefill, mixed, uniform
decode, speculative verification) with the keys cut at fixed absolute positions.

Split j holds keys [j * C, (j + 1) * C) (C: kernels/fixed_split_plan.py, from the
configuration only). A query row at position p attends splits 0 .. p // C: each from a fresh
online-softmax state, over the same BLOCK_N key tiles from the split's start (causal mask
inside), then the splits are folded into one state in the order 0, 1, 2, ... by
_split_state.fold_split. Two ways to run it, with the same bits:
(a) one program per (query block, KV head) walks its splits in order and folds each as it
    ends (`split_programs` = 1);
(b) `split_programs` = P > 1 programs share a (query block, KV head): program i
    computes splits i, i + P, ... and stores each split's state (float32 acc, m, l) to a
    workspace [max_splits, T, Hq, ...]; `_fold_partials_kernel` then folds splits 0 .. p // C
    of each row in order. Only splits the program's rows reach are computed and stored; the
    merge reads only those.
Rows, query block (BLOCK_M, BLOCK_Q), key tile (BLOCK_N) and warps are the varlen kernel's
(varlen_tiles), the same for every query length, so a token's per-tile arithmetic is the
same in every batch; one compiled binary serves both ways (the way is a runtime argument).
The fold kernel has rows of its own (fold_rows): it does no dot, only elementwise float32
operations per row, so how rows are grouped into programs never changes a bit. Both grids hold
a program for each query block a request needs, each finding its request on the device
(kernels/_query_blocks.py); where a program runs never changes its arithmetic either.

No host sync, and the workspace's shape comes from q's token count and the block table's
width: safe to capture in a CUDA graph. Runtime ints that vary with the batch are never
specialised on, so the warmup's launches compile every binary serving needs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from warmgate.server.kernels._attention_tile import LOG2E, M_INIT, attend_range
from warmgate.server.kernels._launch import ieee_dots, pow2, prepare_paged_attention, upcast_dots
from warmgate.server.kernels._query_blocks import REQ_CHUNK, locate_block, query_block_programs
from warmgate.server.kernels._split_state import fold_split, normalised, query_rows
from warmgate.server.kernels.fixed_split_plan import cdiv
from warmgate.server.kernels.varlen_attention import varlen_tiles

# The fold holds two [rows, head_dim] float32 tiles (the running state and the split it
# loads) in 4 warps. At the attention's 128 rows and head_dim 128 that is 256 registers a
# thread, past the register file: on an H100 the fold then took 955 us of llama-3.1-8b's
# 7.2 ms batch-1 step (30 us a layer, h100-step-kernels-det.txt), and way (b) ran slower
# than walking the splits in one program at every program count (h100-fixed-split-
# attention-llama-3.1-8b.txt); llama-3.2-1b, at head_dim 64, gained from it. At most this
# many elements a tile: 16 registers a thread.
FOLD_TILE_ELEMENTS = 2048
FOLD_WARPS = 4


@triton.jit(do_not_specialize=["num_tokens", "num_reqs", "split_programs", "write_partials"])
def _fixed_split_kernel(
    q_ptr, key_cache_ptr, value_cache_ptr, block_table_ptr, seq_lens_ptr, query_start_loc_ptr,
    out_ptr, part_acc_ptr, part_m_ptr, part_l_ptr,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_bt,
    stride_cb, stride_cs, stride_ch,
    qk_scale, num_tokens, num_reqs, split_programs, write_partials,
    GROUP: tl.constexpr, NUM_HEADS: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr, PAGE_SIZE: tl.constexpr, SPLIT_KEYS: tl.constexpr,
    UPCAST: tl.constexpr, IEEE: tl.constexpr, REQ_CHUNK: tl.constexpr,
):
    """Grid (query block programs, KV heads * split_programs)."""
    req, q_block = locate_block(query_start_loc_ptr, num_reqs, tl.program_id(0), BLOCK_Q,
                                REQ_CHUNK)
    kv_head = tl.program_id(1) // split_programs
    first_split = tl.program_id(1) % split_programs
    token, head, row_mask, q_pos, first_pos, hi, q_len = query_rows(
        q_block, req, kv_head, seq_lens_ptr, query_start_loc_ptr, GROUP, BLOCK_M, BLOCK_Q)
    if q_block * BLOCK_Q >= q_len:
        return
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    io_mask = row_mask[:, None] & d_mask[None, :]
    q = tl.load(q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=io_mask, other=0.0)  # [BLOCK_M, BLOCK_D]
    table_row = block_table_ptr + req.to(tl.int64) * stride_bt
    # Workspace offsets of this program's rows within one split (strides from runtime ints:
    # an argument stride would be specialised on its divisibility, which varies with T).
    part_row = token * NUM_HEADS + head  # [BLOCK_M]
    split_rows = num_tokens.to(tl.int64) * NUM_HEADS

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], M_INIT, dtype=tl.float32)
    # Splits holding a key some row sees; a padding request (no keys at all) has none.
    num_splits = tl.cdiv(tl.maximum(hi, 0), SPLIT_KEYS)
    for j in range(first_split, num_splits, split_programs):
        lo = j * SPLIT_KEYS
        acc_s = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        l_s = tl.zeros([BLOCK_M], dtype=tl.float32)
        m_s = tl.full([BLOCK_M], M_INIT, dtype=tl.float32)
        acc_s, l_s, m_s = attend_range(
            acc_s, l_s, m_s, q, q_pos, first_pos, key_cache_ptr, value_cache_ptr, table_row,
            lo, tl.minimum(lo + SPLIT_KEYS, hi), kv_head, offs_d, d_mask,
            stride_cb, stride_cs, stride_ch, qk_scale,
            BLOCK_N=BLOCK_N, PAGE_SIZE=PAGE_SIZE, UPCAST=UPCAST, IEEE=IEEE)
        if write_partials != 0:
            at = j * split_rows + part_row  # [BLOCK_M] int64
            tl.store(part_acc_ptr + at[:, None] * HEAD_DIM + offs_d[None, :], acc_s,
                     mask=io_mask)
            tl.store(part_m_ptr + at, m_s, mask=row_mask)
            tl.store(part_l_ptr + at, l_s, mask=row_mask)
        else:
            acc, l_i, m_i = fold_split(acc, l_i, m_i, acc_s, l_s, m_s, row_mask & (lo <= q_pos))
    if write_partials == 0:
        dst = token[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
        tl.store(out_ptr + dst, normalised(acc, l_i).to(out_ptr.dtype.element_ty),
                 mask=io_mask)


@triton.jit(do_not_specialize=["num_tokens", "num_reqs"])
def _fold_partials_kernel(
    part_acc_ptr, part_m_ptr, part_l_ptr, seq_lens_ptr, query_start_loc_ptr, out_ptr,
    stride_ot, stride_oh, num_tokens, num_reqs,
    GROUP: tl.constexpr, NUM_HEADS: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    SPLIT_KEYS: tl.constexpr, REQ_CHUNK: tl.constexpr,
):
    """Grid (query block programs, KV heads): each row folds its splits 0 .. q_pos // C
    from the workspace in order, as way (a) folds them, then normalises and stores."""
    req, q_block = locate_block(query_start_loc_ptr, num_reqs, tl.program_id(0), BLOCK_Q,
                                REQ_CHUNK)
    kv_head = tl.program_id(1)
    token, head, row_mask, q_pos, _first_pos, hi, q_len = query_rows(
        q_block, req, kv_head, seq_lens_ptr, query_start_loc_ptr, GROUP, BLOCK_M, BLOCK_Q)
    if q_block * BLOCK_Q >= q_len:
        return
    offs_d = tl.arange(0, BLOCK_D)
    io_mask = row_mask[:, None] & (offs_d < HEAD_DIM)[None, :]
    part_row = token * NUM_HEADS + head
    split_rows = num_tokens.to(tl.int64) * NUM_HEADS
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], M_INIT, dtype=tl.float32)
    for j in range(0, tl.cdiv(tl.maximum(hi, 0), SPLIT_KEYS)):
        live = row_mask & (j * SPLIT_KEYS <= q_pos)  # exactly the splits (b) stored
        at = j * split_rows + part_row
        acc_s = tl.load(part_acc_ptr + at[:, None] * HEAD_DIM + offs_d[None, :],
                        mask=live[:, None] & io_mask, other=0.0)
        m_s = tl.load(part_m_ptr + at, mask=live, other=M_INIT)
        l_s = tl.load(part_l_ptr + at, mask=live, other=0.0)
        acc, l_i, m_i = fold_split(acc, l_i, m_i, acc_s, l_s, m_s, live)
    dst = token[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
    tl.store(out_ptr + dst, normalised(acc, l_i).to(out_ptr.dtype.element_ty), mask=io_mask)


def key_tile(head_dim: int, dtype: torch.dtype, on_gpu: bool) -> int:
    """BLOCK_N, the keys of one tile: a split size must be a multiple of it."""
    return varlen_tiles(head_dim, dtype, on_gpu)[1]


def query_programs(num_tokens: int, num_reqs: int, group: int, head_dim: int,
                   dtype: torch.dtype, on_gpu: bool) -> int:
    """Programs along the query axis (grid axis 0) for a batch of num_tokens rows and
    num_reqs requests."""
    block_m = max(varlen_tiles(head_dim, dtype, on_gpu)[0], pow2(group))
    return query_block_programs(num_tokens, num_reqs, block_m // group)


def fold_rows(block_m: int, group: int, block_d: int) -> int:
    """The fold kernel's rows a program: at most the attention's, at most
    FOLD_TILE_ELEMENTS // block_d, and at least one token's worth of query heads."""
    return max(pow2(group), min(block_m, pow2(FOLD_TILE_ELEMENTS // block_d)))


def split_bytes(num_tokens: int, num_heads: int, head_dim: int) -> int:
    """The workspace one split takes in way (b): acc, m and l of every query row, float32."""
    return num_tokens * num_heads * (head_dim + 2) * 4


def paged_attention_fixed_split(
    q: torch.Tensor,  # [T, Hq, D]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, Hk, D]
    block_table: torch.Tensor,  # [num_reqs, max_blocks_per_req] int32
    seq_lens: torch.Tensor,  # [num_reqs] int32, including this step's tokens
    query_start_loc: torch.Tensor,  # [num_reqs + 1] int32
    *,
    scale: float,
    max_query_len: int,
    split_keys: int,
    split_programs: int = 1,
    out: torch.Tensor | None = None,  # [T, Hq, D]
    num_reqs: int | None = None,
) -> torch.Tensor:
    """Causal attention for requests with any query lengths, keys cut every `split_keys`.

    Request i's queries are rows query_start_loc[i]:query_start_loc[i+1], at positions
    seq_lens[i] - q_len_i .. seq_lens[i] - 1, within q's rows. max_query_len (a host int) at 0
    launches nothing; rows no request owns are left untouched. split_programs = 1 runs way
    (a), more way (b) (at most one program per split: the workspace holds cdiv(block table
    capacity, split_keys) splits). The bits are the same for every split_programs."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    block_m, block_n, num_warps, num_stages = varlen_tiles(head_dim, q.dtype, q.is_cuda)
    if split_keys < 1 or split_keys % block_n:
        raise ValueError(f"split_keys {split_keys} is not a positive multiple of the "
                         f"{block_n}-key tile")
    if split_programs < 1:
        raise ValueError(f"split_programs {split_programs} must be at least 1")
    launch = prepare_paged_attention(q, kv_cache, seq_lens, num_reqs, out)
    q, out, num_reqs, group = launch.q, launch.out, launch.num_reqs, launch.group
    if num_reqs == 0 or max_query_len == 0:
        return out
    max_splits = cdiv(block_table.shape[1] * launch.block_size, split_keys)
    programs = min(split_programs, max_splits)
    block_m = max(block_m, pow2(group))  # at least one token's worth of heads per program
    block_q = block_m // group
    num_tokens = q.shape[0]
    if programs > 1:
        part_acc = torch.empty((max_splits, num_tokens, num_heads, head_dim),
                               dtype=torch.float32, device=q.device)
        part_m = torch.empty((max_splits, num_tokens, num_heads), dtype=torch.float32,
                             device=q.device)
        part_l = torch.empty_like(part_m)
    else:  # never read; float32 so one binary (its argument types fixed) serves both ways
        part_acc = part_m = part_l = torch.empty(1, dtype=torch.float32, device=q.device)
    consts = dict(GROUP=group, NUM_HEADS=num_heads, BLOCK_M=block_m, BLOCK_Q=block_q,
                  HEAD_DIM=head_dim, BLOCK_D=pow2(head_dim, 16), SPLIT_KEYS=split_keys)
    key_cache, value_cache = launch.key_cache, launch.value_cache
    _fixed_split_kernel[(query_block_programs(num_tokens, num_reqs, block_q),
                         launch.num_kv_heads * programs)](
        q, key_cache, value_cache, block_table, seq_lens, query_start_loc,
        out, part_acc, part_m, part_l,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_table.stride(0),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        scale * LOG2E, num_tokens, num_reqs, programs, int(programs > 1),
        BLOCK_N=block_n, PAGE_SIZE=launch.block_size,
        UPCAST=upcast_dots(q), IEEE=ieee_dots(q.dtype), REQ_CHUNK=REQ_CHUNK,
        num_warps=num_warps, num_stages=num_stages, **consts,
    )
    if programs > 1:
        fold_m = fold_rows(block_m, group, consts["BLOCK_D"])
        fold_consts = dict(consts, BLOCK_M=fold_m, BLOCK_Q=fold_m // group)
        _fold_partials_kernel[(query_block_programs(num_tokens, num_reqs, fold_m // group),
                               launch.num_kv_heads)](
            part_acc, part_m, part_l, seq_lens, query_start_loc, out,
            out.stride(0), out.stride(1), num_tokens, num_reqs, REQ_CHUNK=REQ_CHUNK,
            num_warps=FOLD_WARPS, **fold_consts,
        )
    return out
