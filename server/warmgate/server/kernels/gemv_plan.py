"""How the small-M dense kernel (kernels/dense_gemv.py) cuts one weight [N, K] for M rows.

A decode-sized GEMM is a read of the weight: M <= 16 rows of x are nothing beside N x K
weight elements, so what decides the speed is that every SM streams its own slice of the
weight with enough bytes in flight. The launch is a function of (N, K, the element size, the
SM count) and of M's bucket only (1, or 2..16), never of M itself, so one compiled binary per
weight shape and bucket serves every row count in the bucket:

- bucket 1 (one row, a batch-1 decode): no tensor-core tile to fill, so each program keeps a
  float32 [BLOCK_N, BLOCK_K] partial product per lane and reduces it along K once at the end
  (kernels/moe_gemv.py does the same). BLOCK_N as small as 4 rows: several programs per SM
  are what keep loads in flight, not one program's tile.
- bucket 16 (2..16 rows): tl.dot on a [16, BLOCK_K] x [BLOCK_K, BLOCK_N] tile (16 is its
  smallest row tile; rows past M are masked, never loaded). BLOCK_N from 16 to 64: a wider
  tile reads x (from L2) fewer times per weight row, so the widest that still gives half the
  SMs a program, four stages deep.

Both read every weight element once, along K in rows of 1 KB (one row) or 512 bytes (16
rows) a step: over a grid of tiles, warps and stages on an H100
(bench/results/h100-launch-sweep.txt) the fastest launches of every projection of
llama-3.1-8b and qwen3-30b-a3b stepped that far (but the 8B's gate/up at 8 rows, within 1 %),
against steps of half that in the plan before; and the 16-row tiles so cut beat cuBLAS at 8
rows on the QKV and O projections by 5-10 %. Only when the N tiles leave more than half the
SMs without a program (narrow N) is K split into a fixed number of ranges, whose float32
partials a second, tiny kernel adds in order.
"""

from __future__ import annotations

from dataclasses import dataclass

# The most rows (tokens) the kernel takes: tl.dot's smallest row tile. Above it the GEMM has
# tensor-core work to do and cuBLAS's tiles are the right tool.
MAX_ROWS = 16
# A one-row program's tile is small, so it takes several programs per SM to keep the loads in
# flight; a 16-row program pipelines its tl.dot operands through shared memory, and its wider
# tile's fewer reads of x are worth leaving some SMs to the others (half of them suffice).
ROW_PROGRAMS_PER_SM = 4
TILE_PROGRAMS_PER_SM = 0.5
# Bytes of one weight row a program loads per K step (16-byte vectors across a warp).
ROW_STEP_BYTES = 1024
TILE_STEP_BYTES = 512
# Pipeline depth of each bucket's K loop.
ROW_STAGES = 3
TILE_STAGES = 4
# A split shorter than this many K steps spends its time starting up, not streaming.
MIN_K_STEPS_PER_SPLIT = 4
MAX_SPLITS = 8


@dataclass(frozen=True)
class GemvLaunch:
    """The launch of one (N, K) weight for one M bucket; the same for every M in it."""

    block_m: int  # 1: a single row, products summed per lane; MAX_ROWS: tl.dot tiles
    block_n: int
    block_k: int
    splits: int  # K ranges run as programs of their own (1: none, no second kernel)
    k_per_split: int  # K elements per range, a multiple of block_k (K with one split)
    num_warps: int
    num_stages: int


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pow2_at_least(n: int, minimum: int) -> int:
    """The next power of two >= max(n, minimum) (Triton tiles have power-of-two extents)."""
    p = 1
    while p < max(n, minimum):
        p *= 2
    return p


def rows_bucket(m: int) -> int:
    """The block_m a launch for m rows takes: 1 for one row, MAX_ROWS for 2..MAX_ROWS."""
    if not 1 <= m <= MAX_ROWS:
        raise ValueError(f"the dense GEMV takes 1..{MAX_ROWS} rows, not {m}")
    return 1 if m == 1 else MAX_ROWS


def _block_n(n: int, choices: tuple[int, ...], programs_per_sm: float, sm_count: int) -> int:
    """The widest tile that still gives every SM programs_per_sm programs; else the narrowest."""
    for block_n in choices:
        if cdiv(n, block_n) >= programs_per_sm * sm_count:
            return block_n
    return choices[-1]


def _splits(n_programs: int, k_steps: int, sm_count: int) -> int:
    """1 while the N tiles give half the SMs a program; else enough K ranges for about two per
    SM, each at least MIN_K_STEPS_PER_SPLIT steps long, at most MAX_SPLITS."""
    if 2 * n_programs >= sm_count:
        return 1
    wanted = cdiv(2 * sm_count, n_programs)
    return max(1, min(wanted, k_steps // MIN_K_STEPS_PER_SPLIT, MAX_SPLITS))


def gemv_launch(n: int, k: int, m: int, element_bytes: int, sm_count: int) -> GemvLaunch:
    """The launch for x [m, k] @ w [n, k]^T (see the module docstring). The split count is
    rounded so that no range is empty: per = cdiv(k_steps, S), S = cdiv(k_steps, per)."""
    block_m = rows_bucket(m)
    if block_m == 1:
        block_k = min(ROW_STEP_BYTES // element_bytes, pow2_at_least(k, 16))
        block_n = _block_n(n, (16, 8, 4), ROW_PROGRAMS_PER_SM, sm_count)
    else:
        block_k = min(TILE_STEP_BYTES // element_bytes, pow2_at_least(k, 16))
        block_n = _block_n(n, (64, 32, 16), TILE_PROGRAMS_PER_SM, sm_count)
    k_steps = cdiv(k, block_k)
    splits = _splits(cdiv(n, block_n), k_steps, sm_count)
    per = cdiv(k_steps, splits)
    splits = cdiv(k_steps, per)
    return GemvLaunch(block_m=block_m, block_n=block_n, block_k=block_k, splits=splits,
                      k_per_split=per * block_k if splits > 1 else k, num_warps=4,
                      num_stages=ROW_STAGES if block_m == 1 else TILE_STAGES)
