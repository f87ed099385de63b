"""The decode kernel's split merge (kernels/decode_attention.py): each split's share of the
keys, and the merge of the splits' partial outputs by their log-sum-exps, which the decode
kernel's last split program runs (with a count buffer) or the merge kernel here does, the
same code in the same order."""

from __future__ import annotations

import triton
import triton.language as tl

from warmgate.server.kernels.pdl import pdl_release, pdl_wait


@triton.jit
def split_chunk(seq_len, num_splits, BLOCK_N: tl.constexpr):
    """Keys per split: an equal share of seq_len rounded up to whole tiles (at least one, so
    the number of splits holding keys, cdiv(seq_len, chunk), is defined for seq_len 0)."""
    return tl.maximum(tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N), 1) * BLOCK_N


# The partials a merge step loads at once. They were just stored by other programs, so each
# load is an L2 round trip, and one split a step ran about 2 x num_active of them one after the
# other (8 splits of one 64-key tile each at a 512-token context; run 27 timed the decode
# kernel with its merge at 9.4 us a layer at batch 1 for 1 MB of KV). A step's tile of
# [splits, BLOCK_M, BLOCK_D] float32 holds at most this many elements: compiled for sm_90
# (tests/decode_spill_probe.py), every preset's decode kernel then stays within the registers
# a thread it took with one split a step (128 at BLOCK_M 16, 200-205 at 32) and spills none;
# 8,192 spilled at BLOCK_M 32 and took 138 registers at BLOCK_M 16 with four drafts.
MERGE_TILE_ELEMENTS = 4096
MAX_SPLITS_AT_ONCE = 8


def splits_at_once(block_m: int, block_d: int) -> int:
    """How many splits' partials a merge step loads (a power of two: block_m and block_d are)."""
    return max(1, min(MAX_SPLITS_AT_ONCE, MERGE_TILE_ELEMENTS // (block_m * block_d)))


@triton.jit
def merge_partials(part_out_ptr, part_lse_ptr, out_ptr, token, head, row_mask, offs_d,
                   d_mask, num_active, stride_ps, stride_pt, stride_ph, stride_ls, stride_lt,
                   stride_ot, stride_oh, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                   AT_ONCE: tl.constexpr, VOLATILE: tl.constexpr):
    """out[token, head] = the first num_active splits' partial outputs weighted by their
    log-sum-exps, added in split order. The partials of AT_ONCE splits (splits_at_once) load
    in one step, and each split's term is taken out of the loaded tile exactly (a sum with
    zeros), so the order and the bits do not depend on how a kernel lays the tile out: the
    decode kernel's merge and the merge kernel agree. VOLATILE: the partials were stored by
    other programs of this grid (the decode kernel's own merge), so no load may come from a
    stale cache line."""
    mask = row_mask[:, None] & d_mask[None, :]
    lse_off = token * stride_lt + head  # [BLOCK_M]
    offs_s = tl.arange(0, AT_ONCE)
    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    for s0 in range(0, num_active, AT_ONCE):
        if AT_ONCE == 1:  # a [1, BLOCK_M] tile would cost registers for nothing
            lse = tl.load(part_lse_ptr + s0 * stride_ls + lse_off, mask=row_mask,
                          other=float("-inf"), volatile=VOLATILE)
        else:
            live = (s0 + offs_s) < num_active  # [AT_ONCE]
            lse = tl.max(tl.load(
                part_lse_ptr + (s0 + offs_s)[:, None] * stride_ls + lse_off[None, :],
                mask=live[:, None] & row_mask[None, :], other=float("-inf"),
                volatile=VOLATILE), axis=0)
        m = tl.maximum(m, lse)
    # No split held keys (a padding request): no weight at all, and the output is 0.
    m = tl.where(m == float("-inf"), 0.0, m)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    denom = tl.zeros([BLOCK_M], dtype=tl.float32)
    src = token[:, None] * stride_pt + head[:, None] * stride_ph + offs_d[None, :]
    for s0 in range(0, num_active, AT_ONCE):
        if AT_ONCE == 1:
            w = tl.exp2(tl.load(part_lse_ptr + s0 * stride_ls + lse_off, mask=row_mask,
                                other=float("-inf"), volatile=VOLATILE) - m)  # [BLOCK_M]
            o = tl.load(part_out_ptr + s0 * stride_ps + src, mask=mask, other=0.0,
                        volatile=VOLATILE)
            acc += w[:, None] * o
            denom += w
        else:
            live = (s0 + offs_s) < num_active
            lse = tl.load(part_lse_ptr + (s0 + offs_s)[:, None] * stride_ls + lse_off[None, :],
                          mask=live[:, None] & row_mask[None, :], other=float("-inf"),
                          volatile=VOLATILE)
            ws = tl.exp2(lse - m[None, :])  # [AT_ONCE, BLOCK_M]; 0 past num_active
            parts = tl.load(
                part_out_ptr + (s0 + offs_s)[:, None, None] * stride_ps + src[None, :, :],
                mask=live[:, None, None] & mask[None, :, :], other=0.0,
                volatile=VOLATILE)  # [AT_ONCE, BLOCK_M, BLOCK_D]
            for j in tl.static_range(AT_ONCE):
                w = tl.sum(tl.where(offs_s[:, None] == j, ws, 0.0), axis=0)  # [BLOCK_M]
                acc += w[:, None] * tl.sum(tl.where(offs_s[:, None, None] == j, parts, 0.0),
                                           axis=0)
                denom += w
    o = acc / tl.where(denom > 0.0, denom, 1.0)[:, None]
    dst = token[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
    tl.store(out_ptr + dst, o.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["num_splits"])
def merge_splits_kernel(
    part_out_ptr, part_lse_ptr, query_start_loc_ptr, seq_lens_ptr, out_ptr,
    stride_ps, stride_pt, stride_ph, stride_ls, stride_lt, stride_ot, stride_oh,
    num_splits,
    GROUP: tl.constexpr, Q_LEN: tl.constexpr, BLOCK_M: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    AT_ONCE: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    pdl_wait(USE_PDL)  # the partials are the decode kernel's output
    pdl_release(USE_PDL)
    # Only the splits that held keys wrote partials (the decode kernel's empty ones return).
    seq_len = tl.load(seq_lens_ptr + req)
    num_active = tl.cdiv(seq_len, split_chunk(seq_len, num_splits, BLOCK_N))
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.minimum(tl.load(query_start_loc_ptr + req + 1) - q_start, Q_LEN)
    offs_m = tl.arange(0, BLOCK_M)
    draft = offs_m // GROUP
    head = kv_head * GROUP + offs_m % GROUP
    token = (q_start + draft).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    merge_partials(part_out_ptr, part_lse_ptr, out_ptr, token, head, draft < q_len, offs_d,
                   offs_d < HEAD_DIM, num_active, stride_ps, stride_pt, stride_ph, stride_ls,
                   stride_lt, stride_ot, stride_oh, BLOCK_M, BLOCK_D, AT_ONCE, False)
