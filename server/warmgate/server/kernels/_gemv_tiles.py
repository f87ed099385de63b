"""The dense GEMV kernel's pieces (kernels/dense_gemv.py): which weight rows a program reads,
how a tile's total is stored (SiLU-and-mul computed on it with ACT), how its x tile is loaded
(SiLU-and-mul computed in the load), the early read of a first weight tile, and the one-row
norm's prologue."""

from __future__ import annotations

import triton
import triton.language as tl

from warmgate.server.kernels._row_norm import residual_sum, rstd_of


@triton.jit
def tile_rows(N: tl.constexpr, BLOCK_N: tl.constexpr, ACT: tl.constexpr):
    """(the weight rows this program reads [BLOCK_N], their mask). ACT: the weight is gate/up
    [2N, K], and the program reads BLOCK_N // 2 gate rows and the up rows N below them, in
    that order, for the BLOCK_N // 2 output columns it owns; else BLOCK_N rows of w [N, K]."""
    offs = tl.arange(0, BLOCK_N)
    if ACT:
        half: tl.constexpr = BLOCK_N // 2
        cols = tl.program_id(0) * half + offs % half
        return cols + (offs >= half).to(tl.int32) * N, cols < N
    rows = tl.program_id(0) * BLOCK_N + offs
    return rows, rows < N


@triton.jit
def silu_mul_tile(total, offs_m, m_mask, out_ptr, N: tl.constexpr, BLOCK_N: tl.constexpr):
    """ACT's store: total [rows, BLOCK_N] holds the gate columns then the up columns
    (tile_rows); each is rounded to out's dtype as the GEMV would store it, then
    silu(gate) * up as kernels/activation.py computes and rounds it -> out [M, N]."""
    half: tl.constexpr = BLOCK_N // 2
    rows: tl.constexpr = total.shape[0]
    gate, up = tl.split(tl.permute(tl.reshape(total, (rows, 2, half)), (0, 2, 1)))
    g = gate.to(out_ptr.dtype.element_ty).to(tl.float32)
    u = up.to(out_ptr.dtype.element_ty).to(tl.float32)
    act = g / (1.0 + tl.exp(-g))
    cols = tl.program_id(0) * half + tl.arange(0, half)
    tl.store(out_ptr + offs_m[:, None] * N + cols[None, :],
             (act * u).to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & (cols < N)[None, :])


@triton.jit
def finish(total, offs_m, offs_n, m_mask, n_mask, bias_ptr, out_ptr, ws_ptr, M, has_bias,
           N: tl.constexpr, SPLITS: tl.constexpr, ACT: tl.constexpr, BLOCK_N: tl.constexpr):
    """total [rows, BLOCK_N] float32 -> out (plus the bias, cast), or with a K split this
    range's partial -> ws [SPLITS, M, N] float32; ACT (no split, no bias): silu_mul_tile."""
    mask = m_mask[:, None] & n_mask[None, :]
    if ACT:
        silu_mul_tile(total, offs_m, m_mask, out_ptr, N, BLOCK_N)
    elif SPLITS == 1:
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
