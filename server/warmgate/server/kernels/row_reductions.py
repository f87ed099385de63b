"""Softmax and cumulative sum along rows, one program per row, for the sampler's warpers under
`--deterministic` on CUDA.

torch's softmax and cumsum kernels may pick another reduction split for another row count, so
a row's probabilities (and with them a seeded row's token) could depend on its batch. Here a
program walks its own row in chunks of ROW_BLOCK columns, from the first to the last, and every
addition's place is fixed by (row length, ROW_BLOCK) alone: a row gets the same bits alone, in
any batch and at any position.

ROW_BLOCK is one constant rather than a size picked from the row length, and the length is not
a specialisation: the warpers reduce over the vocabulary and over the top-k width, which
changes with the requests' top_k, and each width must not compile a binary of its own after
the warmup.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from warmgate.server.kernels._launch import elementwise_warps
from warmgate.server.kernels._row_softmax_state import row_max_and_sum

__all__ = ["ROW_BLOCK", "row_cumsum", "row_softmax"]

# Columns a program holds at once: 1024 floats is one pass of 4 warps (elementwise_warps).
ROW_BLOCK = 1024


@triton.jit(do_not_specialize=["n_cols"])
def _row_softmax_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * n_cols
    out_row = out_ptr + row * n_cols
    offs = tl.arange(0, BLOCK)
    # A row of only -inf gives 0 / 0, NaN, as torch.softmax does.
    safe_row_max, total = row_max_and_sum(x_row, n_cols, BLOCK)
    for c0 in range(0, n_cols, BLOCK):
        mask = c0 + offs < n_cols
        x = tl.load(x_row + c0 + offs, mask=mask, other=float("-inf")).to(tl.float32)
        tl.store(out_row + c0 + offs, tl.exp(x - safe_row_max) / total, mask=mask)


@triton.jit
def _maximum(a, b):
    return tl.maximum(a, b)


@triton.jit(do_not_specialize=["n_cols"])
def _row_cumsum_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * n_cols
    out_row = out_ptr + row * n_cols
    offs = tl.arange(0, BLOCK)
    # The running total before this chunk, held in every lane (a vector keeps the loop-carried
    # value's type and shape plain).
    carry = tl.zeros((BLOCK,), dtype=tl.float32)
    for c0 in range(0, n_cols, BLOCK):
        mask = c0 + offs < n_cols
        x = tl.load(x_row + c0 + offs, mask=mask, other=0.0).to(tl.float32)
        # The GPU's tl.cumsum adds in a tree, and two neighbouring prefixes summed in other
        # orders can round an ulp apart the wrong way (an H100 did, at 300 and 1500 columns):
        # the running max keeps a nonnegative row's mass from stepping back, within its
        # rounding of the exact sum. Adding one carry to every lane keeps the order.
        scan = tl.associative_scan(tl.cumsum(x, axis=0), 0, _maximum) + carry
        tl.store(out_row + c0 + offs, scan, mask=mask)
        # The next chunk continues from this chunk's last output itself (masked lanes added
        # zeros), so the scan never steps back across a chunk boundary; picking one lane out
        # by a sum of it and zeros is exact.
        carry = tl.zeros((BLOCK,), dtype=tl.float32) + tl.sum(
            tl.where(offs == BLOCK - 1, scan, 0.0), axis=0)


def _checked_rows(name: str, x: torch.Tensor) -> torch.Tensor:
    if x.dim() != 2:
        raise ValueError(f"{name}: x {tuple(x.shape)} is not [rows, columns]")
    if not x.dtype.is_floating_point:
        raise ValueError(f"{name}: x is {x.dtype}, not a floating-point tensor")
    # Rows are addressed as row * n_cols: a dense copy where x is a strided view.
    return x.contiguous()


def row_softmax(x: torch.Tensor, block: int = ROW_BLOCK) -> torch.Tensor:
    """x [N, V] (any float dtype, each row with at least one finite value) -> float32 [N, V],
    softmax along each row; -inf entries give 0. block: columns per chunk (a power of two;
    other values are for tests)."""
    x = _checked_rows("row_softmax", x)
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)  # [N, V]
    if x.numel():
        _row_softmax_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=block,
                                           num_warps=elementwise_warps(block))
    return out


def row_cumsum(x: torch.Tensor, block: int = ROW_BLOCK) -> torch.Tensor:
    """x [N, W] (any float dtype, nonnegative: probabilities) -> float32 [N, W], the inclusive
    sum along each row, never decreasing along it. block: columns per chunk (a power of two;
    other values are for tests)."""
    x = _checked_rows("row_cumsum", x)
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)  # [N, W]
    if x.numel():
        _row_cumsum_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=block,
                                          num_warps=elementwise_warps(block))
    return out
