"""The pieces of --deterministic attention that both of its kernels share, so that a key split's
state is folded by the very same float32 operations whichever kernel folds it.

- `query_rows`: the rows a program holds, laid out as the varlen kernel lays them: BLOCK_Q
  consecutive query tokens of one request times the GROUP query heads of one KV head
  (row r = token r // GROUP, head r % GROUP).
- `fold_split`: adds one key split's online-softmax state (acc unnormalised, l, m; log2
  domain) into a running one. Only rows that see the split's first key (`live`) take it: a
  row never folds a split that lies wholly after it, so how many masked splits a program walks
  past (which depends on its neighbours) cannot touch its bits.
- `normalised`: the running state's output, 0 for rows that saw no key (padding), never NaN.

The fold's multiply-adds are explicit fma: a compiler left to contract `acc * a + b` itself
may do so in one kernel and not in another, and the two ways of running the splits live in
two kernels.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def query_rows(q_block, req, kv_head, seq_lens_ptr, query_start_loc_ptr,
               GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr):
    """(token [BLOCK_M] int64, head [BLOCK_M], row_mask [BLOCK_M], q_pos [BLOCK_M],
    first_pos, hi, q_len): the rows' token indices, query heads and absolute positions; the
    first row's position; hi = the keys [0, hi) the program's last row sees."""
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    context_len = tl.load(seq_lens_ptr + req) - q_len  # tokens cached before this step
    first = q_block * BLOCK_Q  # the program's first query token within the request
    offs_m = tl.arange(0, BLOCK_M)
    local = offs_m // GROUP
    head = kv_head * GROUP + offs_m % GROUP
    tq = first + local  # [BLOCK_M] query token index within the request
    row_mask = (local < BLOCK_Q) & (tq < q_len)
    token = (q_start + tq).to(tl.int64)
    hi = context_len + tl.minimum(first + BLOCK_Q, q_len)
    return token, head, row_mask, context_len + tq, context_len + first, hi, q_len


@triton.jit
def fold_split(acc, l_i, m_i, acc_s, l_s, m_s, live):
    """The running state (acc [BLOCK_M, BLOCK_D], l, m [BLOCK_M] float32) with split state
    (acc_s, l_s, m_s) folded into its `live` rows; the other rows are returned unchanged."""
    # Computed for every row (both factors <= 1, so no row overflows), kept for live ones.
    m_new = tl.maximum(m_i, m_s)
    alpha = tl.exp2(m_i - m_new)  # rescales what was folded before
    beta = tl.exp2(m_s - m_new)  # rescales the split
    acc_new = tl.fma(acc, alpha[:, None], acc_s * beta[:, None])
    l_new = tl.fma(l_i, alpha, l_s * beta)
    return (tl.where(live[:, None], acc_new, acc), tl.where(live, l_new, l_i),
            tl.where(live, m_new, m_i))


@triton.jit
def normalised(acc, l_i):
    """acc / l per row; rows that saw no key (l = 0: a padding request) give 0."""
    return acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
