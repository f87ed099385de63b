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


@triton.jit
def merge_partials(part_out_ptr, part_lse_ptr, out_ptr, token, head, row_mask, offs_d,
                   d_mask, num_active, stride_ps, stride_pt, stride_ph, stride_ls, stride_lt,
                   stride_ot, stride_oh, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                   VOLATILE: tl.constexpr):
    """out[token, head] = the first num_active splits' partial outputs weighted by their
    log-sum-exps, in split order. VOLATILE: the partials were stored by other programs of
    this grid (the decode kernel's own merge), so no load may come from a stale cache line."""
    mask = row_mask[:, None] & d_mask[None, :]
    lse_off = token * stride_lt + head  # [BLOCK_M]
    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    for s in range(num_active):
        lse = tl.load(part_lse_ptr + s * stride_ls + lse_off, mask=row_mask,
                      other=float("-inf"), volatile=VOLATILE)
        m = tl.maximum(m, lse)
    # No split held keys (a padding request): no weight at all, and the output is 0.
    m = tl.where(m == float("-inf"), 0.0, m)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    denom = tl.zeros([BLOCK_M], dtype=tl.float32)
    src = token[:, None] * stride_pt + head[:, None] * stride_ph + offs_d[None, :]
    for s in range(num_active):
        lse = tl.load(part_lse_ptr + s * stride_ls + lse_off, mask=row_mask,
                      other=float("-inf"), volatile=VOLATILE)
        w = tl.exp2(lse - m)  # [BLOCK_M]
        o = tl.load(part_out_ptr + s * stride_ps + src, mask=mask, other=0.0,
                    volatile=VOLATILE)
        acc += w[:, None] * o
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
                   stride_lt, stride_ot, stride_oh, BLOCK_M, BLOCK_D, False)
