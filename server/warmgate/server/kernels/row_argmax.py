"""The index of each row's largest value, as torch.argmax(dim=-1) gives it (the first of equal
values, a NaN above every number), for the sampler's greedy choice and its race's winner.

torch's argmax over a [N, V] tensor is one reduction kernel whose blocks walk whole rows: on
an H100 it took 37 us for one row of a 128,256-token vocabulary and 34 us for 64 rows, 3 % of
llama-3.2-1b's 1.25 ms decode step, where reading the row takes well under a microsecond
(bench/results/h100-step-kernels-llama-3.2-1b.txt). Here the row is cut into CHUNK-column
chunks, a program each: every program stores its chunk's largest value and that value's first
index, then takes a ticket from its row's count, and the last of the row's programs to finish
folds the chunks in order (the decode kernel's split merge does the same). One launch: the
sampler runs eagerly after the forward, a Triton launch cost tens of microseconds of Python on
the H100's host, and at 128 streams of the 1B the engine's Python, not the GPU, set the pace
(bench/results/h100-pyspy-summary-llama-3.2-1b.txt). The row
count and length are runtime values, so one binary per dtype serves every batch and
vocabulary; the result is exact, the same index as torch's, since comparing values rounds
nothing. A tensor whose start is not 16-byte aligned would compile a binary of its own
(Triton specialises a pointer on its alignment), after the warmup if it came only then: it
takes torch's argmax, the same indices.

The counts and the chunks' partials live in a workspace kept per device and grown with the
rows: the last program sets its row's count back to zero, so the next launch finds it zeroed
without a memset of its own. Launches on one device share it, so they must be ordered on one
stream (the sampler's are).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from warmgate.server.kernels._launch import elementwise_warps

__all__ = ["CHUNK", "row_argmax"]

# Columns per program: 63 programs a row on a 128k vocabulary, enough to keep the loads of one
# row in flight across the SMs.
CHUNK = 2048
# Chunks the last program folds at once.
_FOLD = 64
# Above every column index: the masked lanes' index, which a minimum never picks.
_NO_INDEX = tl.constexpr(2**31 - 1)


@triton.jit
def _first_of_best(values, index, mask):
    """(largest, first index of it) over one block's lanes, a NaN ranking above every number.
    Masked lanes must hold -inf; a block of only -inf gives -inf and its first unmasked
    index."""
    is_nan = (values != values) & mask
    any_nan = tl.max(is_nan.to(tl.int32), axis=0) > 0
    best = tl.max(tl.where(is_nan, float("-inf"), values), axis=0)
    hit = tl.where(any_nan, is_nan, (values == best) & mask)
    first = tl.min(tl.where(hit, index, _NO_INDEX), axis=0)
    return tl.where(any_nan, float("nan"), best), first


@triton.jit
def _fold_row(best_ptr, index_ptr, n_chunks, FOLD: tl.constexpr):
    """The row's pick from its chunks' partials at best_ptr, index_ptr [n_chunks]. A chunk's
    index is the first of its best, so the smallest index among the chunks that tie is the
    row's first."""
    offs = tl.arange(0, FOLD)
    best = float("-inf")
    first = _NO_INDEX
    for c0 in range(0, n_chunks, FOLD):
        mask = c0 + offs < n_chunks
        values = tl.load(best_ptr + c0 + offs, mask=mask, other=float("-inf"))
        index = tl.load(index_ptr + c0 + offs, mask=mask, other=_NO_INDEX)
        tile_best, tile_first = _first_of_best(values, index, mask)
        # The first tile sets the row's pick (a row of only -inf included); after it an
        # earlier tile keeps the row on a tie, a NaN wins over any number, the first NaN
        # over a later one.
        later_wins = ((first == _NO_INDEX) | (tile_best > best)
                      | ((tile_best != tile_best) & (best == best)))
        first = tl.where(later_wins, tile_first, first)
        best = tl.where(later_wins, tile_best, best)
    return first


@triton.jit(do_not_specialize=["n_cols", "n_chunks"])
def _row_argmax_kernel(x_ptr, best_ptr, index_ptr, counts_ptr, out_ptr, n_cols, n_chunks,
                       CHUNK: tl.constexpr, FOLD: tl.constexpr):
    """Grid (rows, chunks): chunk c of row r -> best[r, c] (float32), index[r, c] (int32);
    the row's last program to finish -> out[r] (int64). counts [>= rows] int32, zero."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=float("-inf")).to(tl.float32)
    best, first = _first_of_best(x, cols, mask)
    tl.store(best_ptr + row * n_chunks + chunk, best)
    tl.store(index_ptr + row * n_chunks + chunk, first)
    # acq_rel: this chunk's stores are visible before its ticket, and the last ticket's
    # holder sees every chunk's.
    if tl.atomic_add(counts_ptr + row, 1, sem="acq_rel") == n_chunks - 1:
        tl.store(counts_ptr + row, 0)
        pick = _fold_row(best_ptr + row * n_chunks, index_ptr + row * n_chunks, n_chunks, FOLD)
        tl.store(out_ptr + row, pick.to(tl.int64))


@dataclass
class _Workspace:
    """One device's counts (zero between launches) and chunk partials, grown on demand."""

    counts: torch.Tensor  # [rows] int32
    best: torch.Tensor  # [rows * chunks] float32
    index: torch.Tensor  # [rows * chunks] int32


_WORKSPACES: dict[torch.device, _Workspace] = {}


def _workspace(device: torch.device, rows: int, partials: int) -> _Workspace:
    ws = _WORKSPACES.get(device)
    if ws is None or ws.counts.numel() < rows or ws.best.numel() < partials:
        rows = max(rows, ws.counts.numel() if ws else 0)
        partials = max(partials, ws.best.numel() if ws else 0)
        ws = _Workspace(torch.zeros(rows, dtype=torch.int32, device=device),
                        torch.empty(partials, dtype=torch.float32, device=device),
                        torch.empty(partials, dtype=torch.int32, device=device))
        _WORKSPACES[device] = ws
    return ws


def row_argmax(x: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor:
    """x [N, V] (float, V < 2**31) -> int64 [N], torch.argmax(x, dim=-1)'s indices. chunk:
    columns per program (a power of two; other values are for tests)."""
    if x.dim() != 2 or not x.dtype.is_floating_point:
        raise ValueError(f"row_argmax: x {tuple(x.shape)} {x.dtype} is not [rows, columns] "
                         "of a floating-point dtype")
    rows, cols = x.shape
    if cols == 0:
        raise ValueError("row_argmax: rows of no columns have no largest value")
    x = x.contiguous()  # rows are addressed as row * V
    if x.data_ptr() % 16:
        return x.argmax(dim=-1)
    out = torch.empty(rows, dtype=torch.int64, device=x.device)
    if rows == 0:
        return out
    n_chunks = triton.cdiv(cols, chunk)
    ws = _workspace(x.device, rows, rows * n_chunks)
    _row_argmax_kernel[(rows, n_chunks)](x, ws.best, ws.index, ws.counts, out, cols, n_chunks,
                                         CHUNK=chunk, FOLD=_FOLD,
                                         num_warps=elementwise_warps(chunk))
    return out
