"""A row's softmax normaliser in one fixed order: the online max and sum that both the
batch-invariant log-softmax (batch_invariant.py) and the sampler's per-row softmax
(row_reductions.py) take before writing their outputs."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def row_max_and_sum(x_row, n_cols, BLOCK: tl.constexpr):
    """x_row: the row's first element (unit stride), n_cols long. Returns (row max, or 0.0 for
    a row of only -inf; the sum of exp(x - that max)), in float32. Per-lane running max and
    rescaled sum, combined across lanes once at the end: the order of every addition is fixed
    by (n_cols, BLOCK) alone, never by the other rows."""
    offs = tl.arange(0, BLOCK)
    run_max = tl.full((BLOCK,), float("-inf"), dtype=tl.float32)
    run_sum = tl.zeros((BLOCK,), dtype=tl.float32)
    for c0 in range(0, n_cols, BLOCK):
        x = tl.load(x_row + c0 + offs, mask=c0 + offs < n_cols,
                    other=float("-inf")).to(tl.float32)
        new_max = tl.maximum(run_max, x)
        # A lane still at -inf has nothing to rescale (and -inf - -inf would be NaN).
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
        run_sum = run_sum * tl.exp(run_max - safe_max) + tl.exp(x - safe_max)
        run_max = new_max
    row_max = tl.max(run_max, axis=0)
    safe_row_max = tl.where(row_max == float("-inf"), 0.0, row_max)
    return safe_row_max, tl.sum(run_sum * tl.exp(run_max - safe_row_max), axis=0)
