"""How the batch-invariant matmul (kernels/batch_invariant.py) cuts one weight shape [N, K].

Two decisions, kept apart because only the first shapes a row's arithmetic:
- `matmul_tiles(n, k, sm_count)`: the tiles and the K split S. A pure function of the weight's
  shape and the device's SM count, never of the row count M, so a row rounds the same way in
  every batch. Split s sums K tiles [s * per, (s + 1) * per) in increasing order in float32,
  then the S partial sums are added in the order 0..S-1 in float32.
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

# A fixed row tile: sizing it from M (the token count) is exactly what makes default GEMMs
# batch dependent, and another BLOCK_M is another MMA instruction schedule on the GPU.
BLOCK_M = 64
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
    """The launch of one (N, K) weight shape; the same for every row count."""

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
    """matmul_tiles, logged the first time a shape is planned."""
    tiles = matmul_tiles(n, k, sm_count)
    logger.debug("batch-invariant matmul: weight %dx%d on %d SMs -> %d splits of %d K tiles, "
                 "tiles %dx%dx%d, %d warps", n, k, sm_count, tiles.splits,
                 tiles.k_tiles_per_split, tiles.block_m, tiles.block_n, tiles.block_k,
                 tiles.num_warps)
    return tiles
