"""x [M, K] @ w [N, K]^T (+ bias) for M <= 16 rows: the dense projections and the head at
decode sizes, as a read of the weight.

cuBLAS runs these GEMMs with tiles made for larger M (128 x 8 at one row) and, where N is
narrow, a K split reduced by a kernel of its own; it reached 0.81-0.86 of the HBM bandwidth
on llama-3.1-8b decode steps. Here each program owns BLOCK_N weight rows and streams them
along K once, in float32 (kernels/gemv_plan.py: the tiles, the two M buckets, the split for
narrow N). Whether this or cuBLAS runs a (shape, M) is decided by timing both on the device
during the warmup (kernels/linear_choices.py, runner/linear_tuning.py).

Two inputs other than x itself: gate/up rows whose SiLU-and-mul the loads compute (SILU_MUL,
silu_mul_gemv), and rows whose RMSNorm, residual add in front, they compute (NORM,
kernels/norm_gemv.py), so neither activation goes through memory or takes a launch.

One binary per (N, K, dtype, M bucket): M and whether a bias is added are runtime values the
compiler does not specialise on, so every row count of a bucket, with or without a bias,
runs the binary the warmup compiled. Nothing here reads a tensor on the host: the launch is
CUDA-graph capturable.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from warmgate.server.kernels._attention_tile import mm
from warmgate.server.kernels._gemv_tiles import (
    finish,
    row_rstd,
    tile_rows,
    warm_first_tile,
    x_tile,
)
from warmgate.server.kernels._launch import ieee_dots, upcast_dots
from warmgate.server.kernels._row_norm import normed_rows, normed_tile, rows_rstd
from warmgate.server.kernels.gemv_plan import (
    MAX_ROWS,
    GemvLaunch,
    gemv_launch,
    pow2_at_least,
    rows_bucket,
)
from warmgate.server.kernels.matmul_plan import device_sm_count
from warmgate.server.kernels.pdl import launch_args, pdl_release, pdl_wait

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Columns per program of the split-summing kernel.
_SUM_BLOCK_N = 256


@triton.jit(do_not_specialize=["M", "has_bias", "eps"])
def _gemv_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr, ws_ptr, res_ptr, norm_w_ptr, res_out_ptr,
    M, has_bias, eps,
    N: tl.constexpr, K: tl.constexpr, X_STRIDE: tl.constexpr, SILU_MUL: tl.constexpr,
    NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK_H: tl.constexpr,
    SPLITS: tl.constexpr, K_PER_SPLIT: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    UPCAST: tl.constexpr, IEEE: tl.constexpr, ACT: tl.constexpr, USE_PDL: tl.constexpr,
):
    """Grid (N tiles, SPLITS). x [M, X_STRIDE] (X_STRIDE = K, or 2K with SILU_MUL: x is
    gate_up, see _gemv_tiles.x_tile), w [N, K], out [M, N], all contiguous. EVEN_K: K is a
    multiple of BLOCK_K, so no K step is partial and the loads need no K mask. USE_PDL:
    kernels.pdl.
    NORM: the product's input is rms_norm(x (+ res), norm_w, eps), computed per tile from x,
    res [M, K] and norm_w [K] after a prologue that takes each row's sum of squares (one row:
    at once, BLOCK_H being K's power of two; 16 rows: in BLOCK_K chunks), the residual sums
    stored to res_out [M, K] by the grid's first program (see kernels/norm_gemv.py).
    ACT (one K range, no bias): w is gate/up [2N, K] and out [M, N] is silu(gate) * up of the
    product, each program owning BLOCK_N // 2 columns (_gemv_tiles.tile_rows)."""
    offs_n, n_mask = tile_rows(N, BLOCK_N, ACT)
    offs_k = tl.arange(0, BLOCK_K)
    if SPLITS == 1:
        k_lo = 0
        k_hi = K
    else:
        k_lo = tl.program_id(1) * K_PER_SPLIT
        k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * K  # [BLOCK_N, 1]
    if USE_PDL or NORM:  # NORM: the tile comes in while the prologue sums the row's squares
        warm_first_tile(w_rows, k_lo + offs_k, n_mask, k_hi)
    pdl_wait(USE_PDL)  # x is the previous kernel's output; out and ws may be its inputs
    pdl_release(USE_PDL)
    if BLOCK_M == 1:
        if NORM:
            rstd = row_rstd(x_ptr, res_ptr, res_out_ptr, eps, K, HAS_RESIDUAL, BLOCK_H)
        # One row: a float32 product per (weight row, lane), summed along K once at the end.
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            ks = k0 + offs_k
            if EVEN_K:
                k_mask = offs_k < BLOCK_K  # all true
                w = tl.load(w_rows + ks[None, :], mask=n_mask[:, None], other=0.0)
            else:
                k_mask = ks < K
                w = tl.load(w_rows + ks[None, :], mask=n_mask[:, None] & k_mask[None, :],
                            other=0.0)
            if NORM:
                x = normed_tile(x_ptr, res_ptr, norm_w_ptr, ks, k_mask, rstd, HAS_RESIDUAL)
            else:
                x = x_tile(x_ptr + ks, k_mask, K, SILU_MUL)
            acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        offs_m = tl.arange(0, 1)
        finish(tl.sum(acc, axis=1)[None, :], offs_m, offs_n, offs_m < 1, n_mask, bias_ptr,
               out_ptr, ws_ptr, M, has_bias, N, SPLITS, ACT, BLOCK_N)
    else:
        offs_m = tl.arange(0, BLOCK_M)
        m_mask = offs_m < M
        x_rows = x_ptr + offs_m[:, None] * X_STRIDE  # [BLOCK_M, 1]
        if NORM:
            first = (tl.program_id(0) == 0) & (tl.program_id(1) == 0)
            rstd_rows = rows_rstd(x_ptr, res_ptr, res_out_ptr, eps, offs_m, m_mask, first, K,
                                  BLOCK_M, BLOCK_K, HAS_RESIDUAL)
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            ks = k0 + offs_k
            if EVEN_K:
                k_mask = offs_k < BLOCK_K  # all true
                x_mask = m_mask[:, None]
                w = tl.load(w_rows + ks[None, :], mask=n_mask[:, None], other=0.0)
            else:
                k_mask = ks < K
                x_mask = m_mask[:, None] & k_mask[None, :]
                w = tl.load(w_rows + ks[None, :], mask=n_mask[:, None] & k_mask[None, :],
                            other=0.0)
            if NORM:
                x = normed_rows(x_ptr, res_ptr, norm_w_ptr, offs_m[:, None] * K + ks[None, :],
                                ks, x_mask, k_mask, rstd_rows, HAS_RESIDUAL)
            else:
                x = x_tile(x_rows + ks[None, :], x_mask, K, SILU_MUL)
            total += mm(x, tl.trans(w), UPCAST, IEEE)
        finish(total, offs_m, offs_n, m_mask, n_mask, bias_ptr, out_ptr, ws_ptr, M,
               has_bias, N, SPLITS, ACT, BLOCK_N)


@triton.jit(do_not_specialize=["M", "has_bias"])
def _sum_splits_kernel(ws_ptr, bias_ptr, out_ptr, M, has_bias,
                       N: tl.constexpr, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr,
                       USE_PDL: tl.constexpr):
    """out[row, cols] = the SPLITS float32 partials of ws [SPLITS, M, N] added in the order
    0..SPLITS-1, plus the bias, cast."""
    row = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    total = tl.zeros((BLOCK_N,), dtype=tl.float32)
    pdl_wait(USE_PDL)  # ws is the GEMV's output
    for s in tl.static_range(SPLITS):
        total += tl.load(ws_ptr + (s * M + row) * N + offs_n, mask=n_mask, other=0.0)
    pdl_release(USE_PDL)
    if has_bias:
        total += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * N + offs_n, total.to(out_ptr.dtype.element_ty), mask=n_mask)


@functools.cache
def _planned(n: int, k: int, bucket: int, element_bytes: int, sm_count: int) -> GemvLaunch:
    """gemv_launch once per weight shape and row bucket (it depends on M's bucket alone):
    eager forwards call this per linear."""
    return gemv_launch(n, k, bucket, element_bytes, sm_count)


def aligned(t: torch.Tensor) -> bool:
    """A 16-byte aligned start: the compiled binary assumes it (Triton specialises a pointer
    argument on it), so another alignment would compile another binary."""
    return t.data_ptr() % 16 == 0


def gemv_applies(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 silu_mul: bool = False) -> bool:
    """Whether dense_gemv (silu_mul: silu_mul_gemv, x holding gate and up, [M, 2K]) takes
    these arguments as they are: 1..16 contiguous, aligned rows of the weight's dtype, a
    contiguous weight, a bias (if any) of [N] in that dtype."""
    width = 2 * weight.shape[-1] if silu_mul else weight.shape[-1]
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != width:
        return False
    if not 1 <= x.shape[0] <= MAX_ROWS or x.dtype != weight.dtype or x.dtype not in DTYPES:
        return False
    if not (x.is_contiguous() and weight.is_contiguous() and aligned(x) and aligned(weight)):
        return False
    return bias is None or (bias.shape == (weight.shape[0],) and bias.dtype == x.dtype
                            and bias.is_contiguous() and aligned(bias))


def dense_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
               launch: GemvLaunch | None = None, sm_count: int | None = None) -> torch.Tensor:
    """x [M, K] @ weight [N, K]^T (+ bias [N]) -> [M, N] in x's dtype, for 1 <= M <= 16,
    accumulated in float32. `launch` (default: gemv_plan's for the shape and M's bucket) and
    `sm_count` (default: the device's) are there for tests and benchmarks."""
    return run_gemv(x, weight, bias, False, launch, sm_count)


def silu_mul_gemv(gate_up: torch.Tensor, weight: torch.Tensor, *,
                  launch: GemvLaunch | None = None, sm_count: int | None = None
                  ) -> torch.Tensor:
    """silu_and_mul(gate_up) [M, K] @ weight [N, K]^T -> [M, N], gate_up [M, 2K] holding gate
    then up, for 1 <= M <= 16: the MLP's activation and down projection in one launch. The
    activation is computed and rounded as kernels/activation.py computes it, and the product
    is dense_gemv's (the same launch), so the result is dense_gemv(silu_and_mul(gate_up)) to
    the bit; the activation never goes through memory."""
    return run_gemv(gate_up, weight, None, True, launch, sm_count)


@dataclass(frozen=True)
class GemvNorm:
    """norm_gemv's RMSNorm in front of the product (kernels/norm_gemv.py)."""

    residual: torch.Tensor | None
    weight: torch.Tensor
    eps: float
    residual_out: torch.Tensor


def launch_for(x: torch.Tensor, weight: torch.Tensor, launch: GemvLaunch | None,
               sm_count: int | None) -> GemvLaunch:
    """The launch given (checked against x's rows), else gemv_plan's for weight and x's rows
    on this device (or sm_count SMs)."""
    if launch is None:
        sms = device_sm_count(x.device) if sm_count is None else sm_count
        return _planned(weight.shape[0], weight.shape[1], rows_bucket(x.shape[0]),
                        x.element_size(), sms)
    if launch.block_m < x.shape[0]:
        raise ValueError(f"dense_gemv: a launch of {launch.block_m} rows for {x.shape[0]} "
                         "rows")
    return launch


def run_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, silu_mul: bool,
             launch: GemvLaunch | None, sm_count: int | None, norm: GemvNorm | None = None,
             act: bool = False) -> torch.Tensor:
    """The kernel on checked arguments. act: weight is gate/up [2N, K] and the result
    silu(gate) * up of the product, [M, N] (the launch planned for the whole weight, unsplit)."""
    if not gemv_applies(x, weight, bias, silu_mul):
        raise ValueError(f"dense_gemv: x {tuple(x.shape)} {x.dtype}, weight "
                         f"{tuple(weight.shape)} {weight.dtype}, bias "
                         f"{None if bias is None else tuple(bias.shape)}: not 1..{MAX_ROWS} "
                         f"contiguous rows of the weight's dtype and {'twice ' if silu_mul else ''}"
                         "its width")
    m = x.shape[0]
    n, k = weight.shape
    launch = launch_for(x, weight, launch, sm_count)
    if act and (n % 2 or bias is not None or launch.splits > 1 or launch.block_n < 2):
        raise ValueError(f"dense_gemv: SiLU-and-mul of the product needs gate/up rows of even "
                         f"count ({n}), no bias and one K range ({launch.splits})")
    n = n // 2 if act else n  # the output's width
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)  # [M, N]
    # Unread stand-ins keep one signature per shape: the bias slot holds out without a bias,
    # the workspace slot out without a split.
    ws = (torch.empty((launch.splits, m, n), dtype=torch.float32, device=x.device)
          if launch.splits > 1 else out)
    bias_arg = out if bias is None else bias
    has_bias = 0 if bias is None else 1
    pdl = launch_args(x)
    # Without a norm its three arguments are unread stand-ins (x, whose alignment is already
    # in the binary's key); without a residual, two of them.
    res_in = x if norm is None or norm.residual is None else norm.residual
    columns = launch.block_n // 2 if act else launch.block_n  # output columns a program
    _gemv_kernel[(triton.cdiv(n, columns), launch.splits)](
        x, weight, bias_arg, out, ws, res_in, x if norm is None else norm.weight,
        x if norm is None else norm.residual_out, m, has_bias,
        0.0 if norm is None else norm.eps,
        N=n, K=k, X_STRIDE=x.shape[1], SILU_MUL=silu_mul, NORM=norm is not None,
        HAS_RESIDUAL=norm is not None and norm.residual is not None,
        BLOCK_H=pow2_at_least(k, 16) if norm is not None else 16, SPLITS=launch.splits,
        K_PER_SPLIT=launch.k_per_split, EVEN_K=k % launch.block_k == 0,
        BLOCK_M=launch.block_m, BLOCK_N=launch.block_n, BLOCK_K=launch.block_k,
        UPCAST=upcast_dots(x), IEEE=ieee_dots(x.dtype), ACT=act,
        num_warps=launch.num_warps, num_stages=launch.num_stages, **pdl)
    if launch.splits > 1:
        _sum_splits_kernel[(m, triton.cdiv(n, _SUM_BLOCK_N))](
            ws, bias_arg, out, m, has_bias, N=n, SPLITS=launch.splits, BLOCK_N=_SUM_BLOCK_N,
            num_warps=4, **pdl)
    return out
