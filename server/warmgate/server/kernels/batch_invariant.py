"""Batch-invariant kernels: a row's result never depends on how many other rows run with it.

The default GEMM picks another algorithm, tiling or split-K for another token count, so the
same row can round differently alone and inside a batch. Here every choice that shapes a row's
arithmetic (tile sizes, reduction order, warps) is a function of the reduced and output widths
only, never of the row count, and no reduction is split across programs:
- `matmul`: x @ w.T with fixed BLOCK_M/N/K tiles from (N, K), a plain grid, no split-K; each
  output element accumulates its K blocks in order, in float32;
- `log_softmax`: one program per row, the vocabulary walked in fixed-size chunks;
- `rms_norm`: kernels/rms_norm.py already is one program per row reducing the whole row in one
  block, so it is re-exported here rather than duplicated (tests pin that property).
`--deterministic` selects them on CUDA (kernels/invariant_ops.py).
"""

from __future__ import annotations

from dataclasses import dataclass

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
from warmgate.server.kernels.rms_norm import rms_norm

__all__ = ["MatmulTiles", "log_softmax", "matmul", "matmul_tiles", "rms_norm"]

# A fixed row tile: sizing it from M (the token count) is exactly what makes default GEMMs
# batch dependent. 64 keeps decode-sized batches in one row tile on the GPU.
BLOCK_M = 64
_MAX_BLOCK_N = 128
_MAX_BLOCK_K = 64
# Vocabulary chunk for log_softmax: a fixed constant, so the reduction order depends on V only.
_MAX_BLOCK_V = 4096


@dataclass(frozen=True)
class MatmulTiles:
    """The launch of one (N, K) weight shape; the same for every row count."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


def matmul_tiles(n: int, k: int) -> MatmulTiles:
    """Tiles from the weight's shape only: [N, K] -> MatmulTiles (16 is tl.dot's minimum)."""
    block_n = min(pow2(n, 16), _MAX_BLOCK_N)
    block_k = min(pow2(k, 16), _MAX_BLOCK_K)
    return MatmulTiles(block_m=BLOCK_M, block_n=block_n, block_k=block_k,
                       num_warps=8 if block_n >= 128 else 4, num_stages=3)


# M is a runtime value only: specialising on it (M == 1, M % 16) would compile another binary
# for another batch size, which is what this kernel exists to avoid.
@triton.jit(do_not_specialize=["M"])
def _matmul_kernel(
    a_ptr, b_ptr, c_ptr,
    M, N, K,
    stride_am, stride_bn, stride_cm,
    UPCAST: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    m_mask = offs_m < M
    n_mask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + offs_n[None, :] * stride_bn + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # One pass over K in increasing order, whole tiles only (masked lanes add exact zeros):
    # every output element sees the same sequence of products whatever M is.
    for k0 in range(0, tl.cdiv(K, BLOCK_K)):
        k_mask = offs_k < K - k0 * BLOCK_K
        a = tl.load(a_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        acc += mm(a, b, UPCAST, IEEE)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ w [N, K]^T -> [M, N] in x's dtype, accumulated in float32."""
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
    tiles = matmul_tiles(n, k)
    grid = (triton.cdiv(m, tiles.block_m) * triton.cdiv(n, tiles.block_n),)
    _matmul_kernel[grid](
        a, b, out, m, n, k,
        a.stride(0), b.stride(0), out.stride(0),
        UPCAST=upcast_dots(a), IEEE=ieee_dots(a.dtype),
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    return out


@triton.jit
def _log_softmax_kernel(
    x_ptr, out_ptr, stride_x, stride_o, vocab,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_V)
    # Per-lane running max and rescaled sum, combined across lanes once at the end: the order
    # of every addition is fixed by (vocab, BLOCK_V) alone.
    run_max = tl.full((BLOCK_V,), float("-inf"), dtype=tl.float32)
    run_sum = tl.zeros((BLOCK_V,), dtype=tl.float32)
    for v0 in range(0, vocab, BLOCK_V):
        mask = v0 + offs < vocab
        x = tl.load(x_ptr + row * stride_x + v0 + offs, mask=mask,
                    other=float("-inf")).to(tl.float32)
        new_max = tl.maximum(run_max, x)
        # A lane still at -inf has nothing to rescale (and -inf - -inf would be NaN).
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
        run_sum = run_sum * tl.exp(run_max - safe_max) + tl.exp(x - safe_max)
        run_max = new_max
    row_max = tl.max(run_max, axis=0)
    safe_row_max = tl.where(row_max == float("-inf"), 0.0, row_max)
    total = tl.sum(run_sum * tl.exp(run_max - safe_row_max), axis=0)
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
