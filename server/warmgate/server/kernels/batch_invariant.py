"""Batch-invariant kernels: a row's result never depends on how many other rows run with it.

The default GEMM picks another algorithm, tiling or split-K for another token count, so the
same row can round differently alone and inside a batch. Here every choice that shapes a row's
arithmetic (the K split, the column and K tiles, the order of additions) is a function of the
reduced and output widths (and the device's SM count) only, never of the row count:
- `matmul`: x @ w.T with BLOCK_N/K tiles and a K split S from (N, K) (kernels/
  matmul_plan.py); each output element sums each of its S fixed K ranges in order in float32,
  then the S partials in the order 0..S-1 in float32, whether the splits ran as programs of
  their own (decode-sized M: partials to a workspace, summed by `_sum_splits_kernel`) or one
  after another in one program (prefill-sized M). The row tile (BLOCK_M) is per launch: an
  unsplit weight's prefill-sized launch takes 128 rows, any other 64; it decides which rows
  share a program, not any row's order of additions (matmul_plan.row_tile);
- `log_softmax`: one program per row, the vocabulary walked in fixed-size chunks;
- `rms_norm`: kernels/rms_norm.py already is one program per row reducing the whole row in one
  block, so it is re-exported here rather than duplicated (tests pin that property).
`--deterministic` selects them on CUDA (kernels/invariant_ops.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from warmgate.server.kernels._attention_tile import mm
from warmgate.server.kernels._launch import (
    elementwise_warps,
    ieee_dots,
    pow2,
    unit_stride_last,
    upcast_dots,
)
from warmgate.server.kernels._row_softmax_state import row_max_and_sum
from warmgate.server.kernels.matmul_plan import (
    MatmulTiles,
    device_sm_count,
    matmul_tiles,
    planned_tiles,
    row_tile,
    splits_in_parallel,
)
from warmgate.server.kernels.rms_norm import rms_norm

__all__ = ["MatmulTiles", "log_softmax", "matmul", "matmul_tiles", "rms_norm"]

# Vocabulary chunk for log_softmax: a fixed constant, so the reduction order depends on V only.
_MAX_BLOCK_V = 4096
# Columns per program of the split-summing kernel: small, so a single decode row still spreads
# over several SMs.
_SUM_BLOCK_N = 256


@triton.jit
def _k_range(a_ptr, b_ptr, offs_m, offs_n, m_mask, n_mask, K, stride_am, stride_bn,
             lo, hi,
             UPCAST: tl.constexpr, IEEE: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The float32 sum of K tiles [lo, hi) for one [BLOCK_M, BLOCK_N] output tile, in
    increasing K order, whole tiles only (masked lanes add exact zeros): every output element
    sees the same sequence of products whatever M is."""
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + (lo * BLOCK_K + offs_k)[None, :]
    b_ptrs = b_ptr + offs_n[None, :] * stride_bn + (lo * BLOCK_K + offs_k)[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(lo, hi):
        k_mask = offs_k < K - kt * BLOCK_K
        a = tl.load(a_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        acc += mm(a, b, UPCAST, IEEE)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    return acc


# M (and splits_per_program, which follows M) are runtime values only: specialising on them
# (== 1, % 16) would compile another binary for another batch size, which is what this kernel
# exists to avoid.
@triton.jit(do_not_specialize=["M", "splits_per_program"])
def _matmul_kernel(
    a_ptr, b_ptr, c_ptr, ws_ptr,
    M, N, K,
    stride_am, stride_bn, stride_cm,
    splits_per_program,
    UPCAST: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLITS: tl.constexpr, K_TILES_PER_SPLIT: tl.constexpr,
):
    """Grid (row tiles x column tiles, SPLITS // splits_per_program). With one split the tile
    goes straight to c. Otherwise a program sums splits [s0, s0 + splits_per_program) in
    order into a float32 total: all SPLITS of them (the total is the result, cast to c), or
    its one split (the total is a partial, stored in float32 to ws [SPLITS, M, N] at s0)."""
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    m_mask = offs_m < M
    n_mask = offs_n < N
    out_mask = m_mask[:, None] & n_mask[None, :]
    k_tiles = tl.cdiv(K, BLOCK_K)
    if SPLITS == 1:
        acc = _k_range(a_ptr, b_ptr, offs_m, offs_n, m_mask, n_mask, K, stride_am,
                       stride_bn, 0, k_tiles, UPCAST, IEEE, BLOCK_M, BLOCK_N, BLOCK_K)
        c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :]
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=out_mask)
    else:
        s0 = tl.program_id(1) * splits_per_program
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for s in range(s0, s0 + splits_per_program):
            lo = s * K_TILES_PER_SPLIT
            hi = tl.minimum(lo + K_TILES_PER_SPLIT, k_tiles)
            total += _k_range(a_ptr, b_ptr, offs_m, offs_n, m_mask, n_mask, K, stride_am,
                              stride_bn, lo, hi, UPCAST, IEEE, BLOCK_M, BLOCK_N, BLOCK_K)
        if splits_per_program == SPLITS:
            c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :]
            tl.store(c_ptrs, total.to(c_ptr.dtype.element_ty), mask=out_mask)
        else:
            # ws is [SPLITS, M, N] contiguous; its strides come from M here, not as arguments
            # (an argument would be specialised on its value's divisibility).
            ws_ptrs = (ws_ptr + s0.to(tl.int64) * M * N + offs_m[:, None] * N
                       + offs_n[None, :])
            tl.store(ws_ptrs, total, mask=out_mask)


@triton.jit(do_not_specialize=["M"])
def _sum_splits_kernel(ws_ptr, c_ptr, M, N, stride_cm,
                       SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """c[row, cols] = the SPLITS float32 partials of ws [SPLITS, M, N] added in the order
    0..SPLITS-1 onto a float32 zero (the same additions as the one-program path), cast."""
    row = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    total = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for s in tl.static_range(SPLITS):
        total += tl.load(ws_ptr + (s * M + row) * N + offs_n, mask=n_mask, other=0.0)
    tl.store(c_ptr + row * stride_cm + offs_n, total.to(c_ptr.dtype.element_ty), mask=n_mask)


def matmul(x: torch.Tensor, w: torch.Tensor, *, tiles: MatmulTiles | None = None,
           sm_count: int | None = None) -> torch.Tensor:
    """x [M, K] @ w [N, K]^T -> [M, N] in x's dtype, accumulated in float32.

    tiles (default: the plan for w's shape, its row tile chosen for M by row_tile) and
    sm_count (default: the device's) are there for tests and benchmarks: given tiles are
    launched as they are, whatever M. A row's bits depend on the plan's K split and column and
    K tiles, never on sm_count alone nor on the row tile."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"matmul: x {tuple(x.shape)} and w {tuple(w.shape)} are not "
                         "[M, K] and [N, K]")
    if x.dtype != w.dtype:
        raise ValueError(f"matmul: x is {x.dtype} but w is {w.dtype}")
    m, k = x.shape
    n = w.shape[0]
    a = unit_stride_last(x)  # [M, K]
    b = unit_stride_last(w)  # [N, K]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)  # [M, N]
    if m == 0 or n == 0:
        return out
    sms = device_sm_count(x.device) if sm_count is None else sm_count
    t = planned_tiles(n, k, sms) if tiles is None else tiles
    # row_tile keeps a split weight's BLOCK_M, the one splits_in_parallel counts programs by.
    block_m, num_warps = row_tile(m, t) if tiles is None else (t.block_m, t.num_warps)
    tile_grid = triton.cdiv(m, block_m) * triton.cdiv(n, t.block_n)
    parallel = splits_in_parallel(m, n, k, t, sms, x.element_size())
    # The workspace [S, M, N] only when the splits run apart. Otherwise ws is never read: with
    # one split any tensor will do; with several, a float32 one, so that a shape's one binary
    # (its argument types fixed) serves both ways.
    if parallel:
        ws = torch.empty((t.splits, m, n), dtype=torch.float32, device=x.device)
    else:
        ws = out if t.splits == 1 else torch.empty(1, dtype=torch.float32, device=x.device)
    _matmul_kernel[(tile_grid, t.splits if parallel else 1)](
        a, b, out, ws, m, n, k,
        a.stride(0), b.stride(0), out.stride(0), 1 if parallel else t.splits,
        UPCAST=upcast_dots(a), IEEE=ieee_dots(a.dtype),
        BLOCK_M=block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k,
        SPLITS=t.splits, K_TILES_PER_SPLIT=t.k_tiles_per_split,
        num_warps=num_warps, num_stages=t.num_stages)
    if parallel:
        _sum_splits_kernel[(m, triton.cdiv(n, _SUM_BLOCK_N))](
            ws, out, m, n, out.stride(0), SPLITS=t.splits, BLOCK_N=_SUM_BLOCK_N,
            num_warps=elementwise_warps(_SUM_BLOCK_N))
    return out


@triton.jit
def _log_softmax_kernel(
    x_ptr, out_ptr, stride_x, stride_o, vocab,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_V)
    # The order of every addition is fixed by (vocab, BLOCK_V) alone.
    safe_row_max, total = row_max_and_sum(x_ptr + row * stride_x, vocab, BLOCK_V)
    log_norm = safe_row_max + tl.log(total)
    for v0 in range(0, vocab, BLOCK_V):
        mask = v0 + offs < vocab
        x = tl.load(x_ptr + row * stride_x + v0 + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * stride_o + v0 + offs, x - log_norm, mask=mask)


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """logits [R, V] (any float dtype) -> float32 [R, V] log-probabilities per row."""
    if logits.dim() != 2:
        raise ValueError(f"log_softmax: logits {tuple(logits.shape)} are not [rows, vocab]")
    x = unit_stride_last(logits)  # [R, V]
    rows, vocab = x.shape
    out = torch.empty((rows, vocab), dtype=torch.float32, device=x.device)  # [R, V]
    if rows == 0 or vocab == 0:
        return out
    block = min(pow2(vocab), _MAX_BLOCK_V)
    _log_softmax_kernel[(rows,)](
        x, out, x.stride(0), out.stride(0), vocab,
        BLOCK_V=block, num_warps=elementwise_warps(block))
    return out
