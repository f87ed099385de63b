"""Paged attention for uniform decode batches (1 + num_spec_steps query tokens per request).

Grid: (num_reqs, num_kv_heads, num_splits). A program holds the q_len * group query rows of
one request and one KV head (row r = draft r // group, query head kv_head * group + r % group),
so a K/V tile is read once for every query head sharing it and for every draft. With
num_splits > 1 each program covers a contiguous, BLOCK_N-aligned share of the context and the
partial results are merged by their log-sum-exp (split-K / flash-decoding), which keeps the
GPU busy when num_reqs * num_kv_heads is small and contexts are long.

The merge runs in the decode kernel when the caller passes a count buffer (the triton
backend does): each split program stores its partial and counts itself in with an atomic add
per (request, KV head), and the last of them to finish sets the count back to zero (ready for
the next replay of a captured graph) and merges all of them, reading the partials with
volatile loads. Otherwise a second kernel merges. Both merges run the same code in the same
order: the same bits, one launch a layer fewer (the merge kernel took about 3 us a layer, and a
launch gap, at batch 1 on qwen3-30b-a3b: run 26 in bench/results/README.md).

Everything the launch needs comes from tensor shapes and Python ints that are fixed for a
captured graph, so the wrapper never syncs and can run under CUDA-graph capture.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import warmgate.server.kernels._decode_merge as _decode_merge
from warmgate.server.kernels._attention_tile import LOG2E, M_INIT, attend_range
from warmgate.server.kernels._decode_merge import merge_partials, split_chunk
from warmgate.server.kernels._decode_rope import (
    DecodeRope,
    cache_new_keys,
    rope_launch_args,
    rotated_rows,
)
from warmgate.server.kernels._launch import ieee_dots, pow2, prepare_paged_attention, upcast_dots
from warmgate.server.kernels.pdl import launch_args, pdl_release, pdl_wait

# A split holds at least one GPU key tile (BLOCK_N = 64): a thinner one would be empty by
# construction, since the kernel rounds each split up to whole tiles.
MIN_TOKENS_PER_SPLIT = 64
# Measured on the H200 (bench/results/h200-decode-kernel.txt): at batch 1 the merge of 64
# splits cost more than their parallelism gave (1.04-1.31x slower than 16).
MAX_SPLITS = 16
# Programs per SM the split grid aims for: a decode program is latency-bound (a chain of
# dependent loads: seq_len, page, K, V), so at least two per SM keep the memory system busy.
PROGRAMS_PER_SM = 2
# A grid this wide (llama-3.2-1b's 8 KV heads at batch 128) keeps enough small programs in
# flight an SM that head_dim 64's thin tiles read faster than the 64-key ones (_decode_config).
MANY_PROGRAMS = 1024


def choose_num_splits(num_reqs: int, num_kv_heads: int, max_context_len: int,
                      num_sms: int) -> int:
    """Splits that bring the grid to at least PROGRAMS_PER_SM programs per SM, from values
    fixed per captured graph.

    max_context_len must be the capacity (max_blocks_per_req * block_size), never this step's
    longest sequence: a captured graph replays with other lengths. A shorter sequence leaves
    the trailing splits empty; they load nothing and the merge skips them. The result is a
    power of two (rounded up, so the grid reaches the target, up to MAX_SPLITS) so only a
    handful of values ever occur.
    """
    programs = max(num_reqs * num_kv_heads, 1)
    wanted = triton.next_power_of_2(triton.cdiv(PROGRAMS_PER_SM * num_sms, programs))
    useful = max(max_context_len // MIN_TOKENS_PER_SPLIT, 1)
    useful = 1 << (useful.bit_length() - 1)  # round down to a power of two
    return min(wanted, useful, MAX_SPLITS)


@triton.jit(do_not_specialize=["num_splits", "num_slots"])
def _decode_kernel(
    q_ptr, key_cache_ptr, value_cache_ptr, block_table_ptr, seq_lens_ptr, query_start_loc_ptr,
    out_ptr, part_out_ptr, part_lse_ptr, counts_ptr,
    k_ptr, v_ptr, positions_ptr, cos_sin_ptr, slot_mapping_ptr, q_norm_ptr, k_norm_ptr,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_bt,
    stride_cb, stride_cs, stride_ch,
    stride_ps, stride_pt, stride_ph, stride_ls, stride_lt,
    stride_kt, stride_kh, stride_vt, stride_vh, stride_cos,
    qk_scale, num_splits, num_slots, eps,
    GROUP: tl.constexpr, Q_LEN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAGE_SIZE: tl.constexpr,
    SPLIT: tl.constexpr, MERGE: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
    ROPE: tl.constexpr, QK_NORM: tl.constexpr, NEW_N: tl.constexpr, USE_PDL: tl.constexpr,
):
    """MERGE (with SPLIT): counts_ptr holds an int32 per (request, KV head), zero, and the
    last split program of each merges (see the module docstring). ROPE: q, k and v are the
    step's unrotated projections and the kernel rotates them and writes the cache itself
    (kernels/_decode_rope.py); otherwise k_ptr .. k_norm_ptr are never read."""
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    pdl_wait(USE_PDL)  # q and the cache are the rope kernel's output, the lengths the step's
    seq_len = tl.load(seq_lens_ptr + req)
    q_start = tl.load(query_start_loc_ptr + req)
    # A graph-padding request may carry fewer tokens than the decode length (even none).
    q_len = tl.minimum(tl.load(query_start_loc_ptr + req + 1) - q_start, Q_LEN)

    offs_m = tl.arange(0, BLOCK_M)
    draft = offs_m // GROUP
    head = kv_head * GROUP + offs_m % GROUP
    row_mask = draft < q_len
    req_rows = row_mask  # the request's rows, whichever split holds keys
    q_pos = seq_len - q_len + draft  # [BLOCK_M]
    if SPLIT:
        chunk = split_chunk(seq_len, num_splits, BLOCK_N)
        lo = split * chunk
        hi = tl.minimum(lo + chunk, seq_len)
        # A split past the end of its sequence loads no query, runs no tile and writes
        # nothing: the merge reads only the splits before cdiv(seq_len, chunk). (Masks, not
        # an early return: the kernel stays one structured block.)
        row_mask = row_mask & ((offs_m * 0 + lo) < hi)
    else:
        lo = 0
        hi = seq_len

    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    token = (q_start + draft).to(tl.int64)  # [BLOCK_M]
    q_off = token * stride_qt + head * stride_qh
    if ROPE:
        q = rotated_rows(q_ptr, q_off, row_mask,
                         tl.load(positions_ptr + token, mask=row_mask, other=0), cos_sin_ptr,
                         stride_cos, q_norm_ptr, eps, q_ptr.dtype.element_ty, BLOCK_M,
                         HEAD_DIM // 2, QK_NORM)
        cache_new_keys(
            k_ptr, v_ptr, key_cache_ptr, value_cache_ptr, positions_ptr, cos_sin_ptr,
            slot_mapping_ptr, k_norm_ptr, eps, num_slots, q_start, q_len, seq_len - q_len, lo,
            hi, kv_head, stride_kt, stride_kh, stride_vt, stride_vh, stride_cos,
            stride_cb, stride_cs, stride_ch,
            NEW_N=NEW_N, HALF=HEAD_DIM // 2, PAGE_SIZE=PAGE_SIZE, QK_NORM=QK_NORM)
        tl.debug_barrier()  # the keys just written are read below, by other threads
    else:
        q = tl.load(q_ptr + q_off[:, None] + offs_d[None, :],
                    mask=row_mask[:, None] & d_mask[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
    pdl_release(USE_PDL)

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], M_INIT, dtype=tl.float32)
    acc, l_i, m_i = attend_range(
        acc, l_i, m_i, q, q_pos, seq_len - q_len,
        key_cache_ptr, value_cache_ptr, block_table_ptr + req.to(tl.int64) * stride_bt,
        lo, hi, kv_head, offs_d, d_mask, stride_cb, stride_cs, stride_ch, qk_scale,
        BLOCK_N=BLOCK_N, PAGE_SIZE=PAGE_SIZE, UPCAST=UPCAST, IEEE=IEEE)

    # Rows that saw no key (a padding request) produce 0, never NaN.
    seen = l_i > 0.0
    o = acc / tl.where(seen, l_i, 1.0)[:, None]
    out_mask = row_mask[:, None] & d_mask[None, :]
    if SPLIT:
        dst = (split * stride_ps + token[:, None] * stride_pt + head[:, None] * stride_ph
               + offs_d[None, :])
        tl.store(part_out_ptr + dst, o, mask=out_mask)
        lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + split * stride_ls + token * stride_lt + head, lse, mask=row_mask)
        if MERGE:
            count = counts_ptr + req * tl.num_programs(1) + kv_head
            if tl.atomic_add(count, 1, sem="acq_rel") == num_splits - 1:  # the last split
                tl.store(count, 0)
                merge_partials(part_out_ptr, part_lse_ptr, out_ptr, token, head, req_rows,
                               offs_d, d_mask, tl.cdiv(seq_len, chunk), stride_ps, stride_pt,
                               stride_ph, stride_ls, stride_lt, stride_ot, stride_oh, BLOCK_M,
                               BLOCK_D, True)
    else:
        dst = token[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
        tl.store(out_ptr + dst, o.to(out_ptr.dtype.element_ty), mask=out_mask)


def _decode_config(head_dim: int, dtype: torch.dtype, on_gpu: bool,
                   programs: int = 0) -> tuple[int, int, int]:
    """(BLOCK_N, num_warps, num_stages) for `programs` (requests x KV heads) a split.

    Decode is bandwidth-bound: 64-key tiles pipelined 2 deep (3 deep measured 0.77-0.98x as
    fast at batch 64/128 on the H200 at head_dim 128: bench/results/h200-decode-kernel.txt);
    float32 tiles are halved to stay inside shared memory. At head_dim 64 from MANY_PROGRAMS
    on, 32-key tiles on 2 warps pipelined 4 deep (bench/results/h100-kernels.txt: they lose at
    512 programs and at head_dim 128). The interpreter gets 16-key tiles so small test
    contexts still cross tile and split boundaries. A function of the batch's request count
    only, so a captured graph keeps its tile; rising with it, so the warmup's decodes at its
    largest batch and at one and two requests compile every tile a served batch takes."""
    if not on_gpu:
        return 16, 4, 1
    if dtype == torch.float32 or head_dim > 128:
        return 32, 4, 2
    if head_dim <= 64 and programs >= MANY_PROGRAMS:
        return 32, 2, 4
    return 64, 4, 2


def merge_counts_for(max_num_reqs: int, num_kv_heads: int, device: torch.device
                     ) -> torch.Tensor:
    """The zeroed count buffer paged_attention_decode merges its splits in-kernel with, for
    batches of up to max_num_reqs requests."""
    return torch.zeros(max_num_reqs * num_kv_heads, dtype=torch.int32, device=device)


def _split_partials(num_splits: int, q: torch.Tensor,
                    out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-split partial outputs [S, T, Hq, D] and log-sum-exps [S, T, Hq] (log2 domain) for
    the merge kernel; with one split, placeholders the kernel never reads (it writes `out`)."""
    num_tokens, num_heads, head_dim = q.shape
    if num_splits > 1:
        return (torch.empty((num_splits, num_tokens, num_heads, head_dim), dtype=torch.float32,
                            device=q.device),
                torch.empty((num_splits, num_tokens, num_heads), dtype=torch.float32,
                            device=q.device))
    return (out.new_empty((1, 1, 1, 1), dtype=torch.float32),
            out.new_empty((1, 1, 1), dtype=torch.float32))


def paged_attention_decode(
    q: torch.Tensor,  # [T, Hq, D], T >= num_reqs * query_len
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, Hk, D]
    block_table: torch.Tensor,  # [num_reqs, max_blocks_per_req] int32
    seq_lens: torch.Tensor,  # [num_reqs] int32, including this step's tokens
    query_start_loc: torch.Tensor,  # [num_reqs + 1] int32
    *,
    scale: float,
    query_len: int,
    num_splits: int = 1,
    out: torch.Tensor | None = None,  # [T, Hq, D]
    num_reqs: int | None = None,
    merge_counts: torch.Tensor | None = None,  # [>= num_reqs * Hk] int32, zero
    rope: DecodeRope | None = None,
) -> torch.Tensor:
    """Causal attention of each request's query_len tokens over its paged context.

    Request i's tokens are rows query_start_loc[i]: (at most query_len of them), at positions
    seq_lens[i] - query_len .. seq_lens[i] - 1. Rows that no request owns are left untouched;
    num_reqs defaults to len(seq_lens). With merge_counts (merge_counts_for) and splits, the
    decode kernel merges them itself (left zero again); without, a second kernel does.
    With `rope`, q, rope.k and rope.v are this step's unrotated projections: the kernel rotates
    q and k as kernels.rope_cache.rope_and_cache does and writes k and v into the cache itself
    (kernels/_decode_rope.py), so no rope-and-cache launch comes before it.
    No host sync: safe to capture in a CUDA graph when num_splits is fixed per graph.
    """
    head_dim = q.shape[2]
    launch = prepare_paged_attention(q, kv_cache, seq_lens, num_reqs, out)
    q, out, num_reqs, group = launch.q, launch.out, launch.num_reqs, launch.group
    if num_reqs == 0:
        return out
    key_cache, value_cache = launch.key_cache, launch.value_cache
    block_size, num_kv_heads = launch.block_size, launch.num_kv_heads
    block_n, num_warps, num_stages = _decode_config(
        head_dim, q.dtype, q.is_cuda, num_reqs * launch.num_kv_heads)
    block_m = pow2(query_len * group, 16)  # tl.dot needs >= 16 rows
    block_d = pow2(head_dim, 16)
    split = num_splits > 1
    counts = merge_counts if split else None
    if counts is not None and counts.numel() < num_reqs * num_kv_heads:
        raise ValueError(f"paged_attention_decode: {counts.numel()} merge counts for "
                         f"{num_reqs} requests x {num_kv_heads} KV heads")
    merge = counts is not None
    part_out, part_lse = _split_partials(num_splits, q, out)
    rope_args = rope_launch_args(rope, q, key_cache, query_len)
    common = dict(GROUP=group, Q_LEN=query_len, BLOCK_M=block_m, HEAD_DIM=head_dim,
                  BLOCK_D=block_d, **launch_args(q))
    _decode_kernel[(num_reqs, num_kv_heads, num_splits)](
        q, key_cache, value_cache, block_table, seq_lens, query_start_loc,
        out, part_out, part_lse, part_lse if counts is None else counts, *rope_args.pointers,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_table.stride(0),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1), *rope_args.strides,
        scale * LOG2E, num_splits, *rope_args.scalars,
        BLOCK_N=block_n, PAGE_SIZE=block_size, SPLIT=split, MERGE=merge,
        UPCAST=upcast_dots(q), IEEE=ieee_dots(q.dtype),
        num_warps=num_warps, num_stages=num_stages, **rope_args.flags, **common,
    )
    if split and not merge:
        _decode_merge.merge_splits_kernel[(num_reqs, num_kv_heads)](
            part_out, part_lse, query_start_loc, seq_lens, out,
            part_out.stride(0), part_out.stride(1), part_out.stride(2),
            part_lse.stride(0), part_lse.stride(1), out.stride(0), out.stride(1),
            num_splits, BLOCK_N=block_n, num_warps=4, **common,
        )
    return out
