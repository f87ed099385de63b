"""The dense GEMV kernel's pieces (kernels/dense_gemv.py): how a tile's total is stored, how
its x tile is loaded (SiLU-and-mul computed in the load), the early read of a first weight
tile, and the one-row norm's prologue."""

from __future__ import annotations

import triton
import triton.language as tl

from warmgate.server.kernels._row_norm import residual_sum, rstd_of


@triton.jit
def finish(total, offs_m, offs_n, m_mask, n_mask, bias_ptr, out_ptr, ws_ptr, M, has_bias,
           N: tl.constexpr, SPLITS: tl.constexpr):
    """total [rows, BLOCK_N] float32 -> out (plus the bias, cast), or with a K split this
    range's partial -> ws [SPLITS, M, N] float32."""
    mask = m_mask[:, None] & n_mask[None, :]
    if SPLITS == 1:
        if has_bias:
            total += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + offs_m[:, None] * N + offs_n[None, :],
                 total.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        rows = tl.program_id(1) * M + offs_m
        tl.store(ws_ptr + rows[:, None] * N + offs_n[None, :], total, mask=mask)


@triton.jit
def x_tile(ptrs, mask, K: tl.constexpr, SILU_MUL: tl.constexpr):
    """x at ptrs. SILU_MUL: ptrs point into rows of gate_up [2K] (gate, then up), and x is
    silu(gate) * up in float32 rounded to their dtype, the operations and the rounding of
    kernels/activation.py's silu_and_mul, so the product sees the bits it would store."""
    if SILU_MUL:
        gate = tl.load(ptrs, mask=mask, other=0.0)
        up = tl.load(ptrs + K, mask=mask, other=0.0).to(tl.float32)
        g = gate.to(tl.float32)
        act = g / (1.0 + tl.exp(-g))
        x = (act * up).to(gate.dtype)
    else:
        x = tl.load(ptrs, mask=mask, other=0.0)
    return x


@triton.jit
def warm_first_tile(w_rows, ks, n_mask, k_hi):
    """Read this program's first weight tile before pdl_wait: no kernel writes the weights,
    so the read may overlap the previous kernel's tail, and the loop's first load of the tile
    then comes from L2. Volatile, so the compiler keeps a load whose value goes unused: the
    loop's arithmetic is the same with PDL as without, bit for bit."""
    tl.load(w_rows + ks[None, :], mask=n_mask[:, None] & (ks < k_hi)[None, :], other=0.0,
            volatile=True)


@triton.jit
def row_rstd(x_ptr, res_ptr, res_out_ptr, eps, K: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
             BLOCK_H: tl.constexpr):
    """NORM's prologue on the one row: its rstd (kernels/_row_norm.py), the residual sum
    stored to res_out by the grid's first program."""
    offs = tl.arange(0, BLOCK_H)
    mask = offs < K
    h = residual_sum(x_ptr, res_ptr, offs, mask, HAS_RESIDUAL)
    if HAS_RESIDUAL:  # noqa: SIM102  # a constexpr test, then a runtime one: not one `and`
        if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
            tl.store(res_out_ptr + offs, h.to(res_out_ptr.dtype.element_ty), mask=mask)
    return rstd_of(tl.sum(h * h, axis=0), K, eps)
