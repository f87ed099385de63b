"""How the batch-invariant matmul (kernels/batch_invariant.py) cuts one weight shape [N, K].

Three decisions, kept apart because only the first shapes a row's arithmetic:
- `matmul_tiles(n, k, sm_count)`: the tiles and the K split S. A pure function of the weight's
  shape and the device's SM count, never of the row count M, so a row rounds the same way in
  every batch. Split s sums K tiles [s * per, (s + 1) * per) in increasing order in float32,
  then the S partial sums are added in the order 0..S-1 in float32.
- `row_tile(m, tiles)`: the rows (and warps) of a launch's tile. An unsplit weight (S = 1)
  launched for at least TALL_BLOCK_M rows takes TALL_BLOCK_M-row tiles, any other launch the
  plan's BLOCK_M. A taller tile only puts more rows beside each other; every row still runs
  the same BLOCK_K steps along K in the same order, each a product summed into its float32
  accumulator, so its bits are the same (bench/lib/invariant_matmul_gpu.py's check "BLOCK_M
  128 == 64" held on an H100 for every weight shape of llama-3.1-8b and llama-3.2-1b).
- `splits_in_parallel(m, n, k, tiles, sm_count, element_bytes)`: whether the S splits of a
  launch run as S programs writing float32 partials to a workspace (then summed by a second
  kernel), or one program walks them in turn and adds each into a running float32 total.
  Both do the same float32 additions in the same order, so the bits are the same; only the
  speed depends on M.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch

from warmgate.server.kernels._launch import pow2

logger = logging.getLogger(__name__)

# The plan's row tile: every launch of a split weight, and of any weight under TALL_BLOCK_M
# rows. A row's bits do not follow the row tile (row_tile), only the launch's speed does.
BLOCK_M = 64
# The row tile of an unsplit weight's launch of at least this many rows (prefill sizes), with
# TALL_NUM_WARPS warps: twice the rows share each weight tile read, where the 64-row tiles ran
# 1.6-3.9x cuBLAS. On an H100 the 8B's gate_up at 512 rows ran 330 against 549 us (cuBLAS
# 159), at 2048 rows 1309 against 2401; its head at 512 rows 1477 against 2830, at 128 rows
# 374 against 710 (cuBLAS 378). Below 128 rows it was no faster (the head at 1-64 rows 352
# against 349 us). Split weights keep BLOCK_M: at prefill sizes the taller tile ran them
# faster at some and up to 50% slower at others.
TALL_BLOCK_M = 128
TALL_NUM_WARPS = 8
MAX_BLOCK_N = 128
# The column tile of a weight that splits K (a narrow N): twice the N tiles for as many
# programs, so fewer splits (a smaller workspace, a shorter sum). On an H100 it ran every split
# shape of llama-3.2-1b and llama-3.1-8b faster at 1-64 rows (the 8B's QKV 22.9 against 27.1
# us, down 46.1 against 58.5), and over a layer's projections at prefill sizes too but for the
# 8B at 512 rows (2% slower).
NARROW_BLOCK_N = 64
MAX_BLOCK_K = 64
# A decode-sized launch aims at two resident programs per SM: a single one streams its weight
# tile with only its own pipeline stages in flight, too few to cover the memory latency.
PROGRAMS_PER_SM = 2
# A split shorter than this leaves the 3-stage load pipeline no steady state.
MIN_K_TILES_PER_SPLIT = 4
# Past this the workspace (S x M x N float32) costs more than the extra programs gain.
MAX_SPLITS = 16
# The interpreter (CPU tensors) has no SMs: plan as for an H100, so the CPU tests take the
# decisions the target GPU takes for the same shapes.
NOMINAL_SM_COUNT = 132


@dataclass(frozen=True)
class MatmulTiles:
    """The plan of one (N, K) weight shape, the same for every row count: the K split, column
    and K tiles, and the row tile and warps of a launch that row_tile leaves at the plan's."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    splits: int = 1  # S: K is summed in S fixed ranges, then the ranges in order
    k_tiles_per_split: int = 0  # whole BLOCK_K tiles per range (0 with one split: all of K)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def split_count(n_tiles: int, k_tiles: int, sm_count: int) -> int:
    """S for a weight of n_tiles BLOCK_N tiles and k_tiles BLOCK_K tiles.

    A decode step has one row tile, so its launch has n_tiles * S programs. When the N tiles
    alone give three quarters of the SMs a program each (the vocabulary head, gate/up), each
    SM already streams its own slice of the weight: S = 1, no workspace. Otherwise S is what
    brings n_tiles * S to PROGRAMS_PER_SM programs per SM, bounded so that every split keeps
    MIN_K_TILES_PER_SPLIT tiles of K and the workspace at most MAX_SPLITS partials."""
    if 4 * n_tiles >= 3 * sm_count:
        return 1
    wanted = cdiv(PROGRAMS_PER_SM * sm_count, n_tiles)
    return max(1, min(wanted, k_tiles // MIN_K_TILES_PER_SPLIT, MAX_SPLITS))


def matmul_tiles(n: int, k: int, sm_count: int = NOMINAL_SM_COUNT) -> MatmulTiles:
    """Tiles and split from the weight's shape [N, K] and the SM count only (16 is tl.dot's
    minimum tile). A weight whose K is split at MAX_BLOCK_N takes NARROW_BLOCK_N columns and
    its split again. The split count is rounded so that no split is empty: S = cdiv(k_tiles,
    per) with per = cdiv(k_tiles, S), the last split taking the remainder."""
    block_n = min(pow2(n, 16), MAX_BLOCK_N)
    block_k = min(pow2(k, 16), MAX_BLOCK_K)
    k_tiles = cdiv(k, block_k)
    splits = split_count(cdiv(n, block_n), k_tiles, sm_count)
    if splits > 1 and block_n > NARROW_BLOCK_N:
        block_n = NARROW_BLOCK_N
        splits = split_count(cdiv(n, block_n), k_tiles, sm_count)
    per = cdiv(k_tiles, splits)
    splits = cdiv(k_tiles, per)
    return MatmulTiles(block_m=BLOCK_M, block_n=block_n, block_k=block_k,
                       num_warps=8 if block_n >= 128 else 4, num_stages=3,
                       splits=splits, k_tiles_per_split=per if splits > 1 else 0)


def row_tile(m: int, tiles: MatmulTiles) -> tuple[int, int]:
    """(BLOCK_M, num_warps) of a launch of m rows: TALL_BLOCK_M rows and TALL_NUM_WARPS warps
    for an unsplit weight (S = 1) at m >= TALL_BLOCK_M, else the plan's. Per launch, like
    splits_in_parallel: the tile changes which rows share a program, never a row's sum (the
    module's docstring). A launch of m rows compiles the binary of its row tile, so the warmup
    runs every m a served batch can launch at (warmup/gemm_shapes.py)."""
    if tiles.splits == 1 and m >= TALL_BLOCK_M:
        return TALL_BLOCK_M, TALL_NUM_WARPS
    return tiles.block_m, tiles.num_warps


def splits_in_parallel(m: int, n: int, k: int, tiles: MatmulTiles, sm_count: int,
                       element_bytes: int) -> bool:
    """Whether the S splits run as programs of their own (a float32 workspace and a summing
    kernel) rather than one after another in each row/column tile's program.

    Both ways do the same additions (the same bits); this only picks the faster, for a launch
    that is bound by reading the weight (W = N x K x element_bytes): in one program, only the
    tile_programs = row tiles x column tiles SMs read it, about W x sm_count / tile_programs
    of time while that is under one program per SM; apart, every SM reads, but the workspace
    adds S x M x N float32 written then read. So apart while tile_programs x (W + workspace)
    < sm_count x W: a decode step (one row tile) splits, a prefill-sized M (whose workspace
    would outgrow the weight) does not. The workspace counted as HBM traffic is pessimistic
    (a decode step's stays in L2), which only moves the switch to a smaller M."""
    if tiles.splits == 1:
        return False
    tile_programs = cdiv(m, tiles.block_m) * cdiv(n, tiles.block_n)
    weight_per_column = k * element_bytes
    workspace_per_column = 2 * 4 * tiles.splits * m
    return tile_programs * (weight_per_column + workspace_per_column) < (
        sm_count * weight_per_column)


@functools.cache
def device_sm_count(device: torch.device) -> int:
    """The SM count of a CUDA device, looked up once per device; NOMINAL_SM_COUNT otherwise."""
    if device.type != "cuda":
        return NOMINAL_SM_COUNT
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.cache
def planned_tiles(n: int, k: int, sm_count: int) -> MatmulTiles:
    """matmul_tiles, logged the first time a shape is planned (with the taller row tile of
    its prefill-sized launches, if it has one)."""
    tiles = matmul_tiles(n, k, sm_count)
    tall_m, tall_warps = row_tile(TALL_BLOCK_M, tiles)
    tall = (f"; from {TALL_BLOCK_M} rows {tall_m}-row tiles, {tall_warps} warps"
            if tall_m != tiles.block_m else "")
    logger.debug("batch-invariant matmul: weight %dx%d on %d SMs -> %d splits of %d K tiles, "
                 "tiles %dx%dx%d, %d warps%s", n, k, sm_count, tiles.splits,
                 tiles.k_tiles_per_split, tiles.block_m, tiles.block_n, tiles.block_k,
                 tiles.num_warps, tall)
    return tiles
