"""The batch-invariant matmul's K split: right within bf16/fp32 tolerance, a row the same bits
alone and inside any batch (whether the splits ran as programs of their own with a workspace
or one after another in one program), and the split rule a function of (N, K, SM count) only.

Runs in the Triton interpreter on the CPU (compiled kernels when a GPU is present).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable

import pytest
import torch

pytest.importorskip("triton")

from triton.runtime.interpreter import InterpretedFunction

from tests.launch_recorder import LaunchRecorder
from tests.paged_reference import tolerance
from warmgate.server.kernels import batch_invariant, matmul_plan
from warmgate.server.kernels.batch_invariant import _matmul_kernel, matmul
from warmgate.server.kernels.matmul_plan import (
    MIN_K_TILES_PER_SPLIT,
    NOMINAL_SM_COUNT,
    MatmulTiles,
    matmul_tiles,
    planned_tiles,
    split_count,
    splits_in_parallel,
)

DEVICE = "cpu" if isinstance(_matmul_kernel, InterpretedFunction) else "cuda"
# Around the 64-row tile: 1 is the reference; 65 and 130 add a second and third row tile.
BATCH_SIZES = (2, 7, 64, 65, 130)
# An SM count under which 65 rows already fill "the GPU": the splits then run one after
# another in one program, while one row alone still runs them as programs of their own.
FEW_SMS = 2
# (N, K, forced splits or None for the plan's): the plan splits K = 520 (9 K tiles, the last
# partial) in two; forced, K = 300 (5 tiles) in three of 2, 2 and 1 tiles.
SPLIT_SHAPES = [(48, 520, None), (40, 300, 3)]


def _tiles(n: int, k: int, splits: int | None) -> MatmulTiles:
    plan = matmul_tiles(n, k, NOMINAL_SM_COUNT)
    if splits is None:
        return plan
    k_tiles = -(-k // plan.block_k)
    per = -(-k_tiles // splits)
    return MatmulTiles(block_m=plan.block_m, block_n=plan.block_n, block_k=plan.block_k,
                       num_warps=plan.num_warps, num_stages=plan.num_stages,
                       splits=-(-k_tiles // per), k_tiles_per_split=per)


def _data(n: int, k: int, rows: int, dtype: torch.dtype,
          seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen).to(DEVICE, dtype)  # [M, K]
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(DEVICE, dtype)  # [N, K]
    return x, w


def _rel_err64(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> float:
    ref = x.cpu().double() @ w.cpu().double().T
    return ((out.cpu().double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("n", "k", "splits"), SPLIT_SHAPES)
@pytest.mark.parametrize("sm_count", [NOMINAL_SM_COUNT, FEW_SMS])
def test_split_matmul_matches_float64(dtype: torch.dtype, n: int, k: int, splits: int | None,
                                      sm_count: int) -> None:
    tiles = _tiles(n, k, splits)
    assert tiles.splits > 1
    x, w = _data(n, k, 70, dtype, seed=11)
    out = matmul(x, w, tiles=tiles, sm_count=sm_count)
    assert out.shape == (70, n) and out.dtype == dtype
    # Within float32 rounding of the float64 product (bf16: of its output rounding).
    assert _rel_err64(out, x, w) <= tolerance(dtype)


def _assert_rows_invariant(fn: Callable[[torch.Tensor], torch.Tensor], rows: torch.Tensor,
                           sizes: tuple[int, ...] = BATCH_SIZES) -> None:
    """Each row of `rows` [R, K] gets from fn the same bits alone as at the first, the last and
    a middle position of batches of every size, beside random other rows."""
    alone = [fn(row.unsqueeze(0))[0] for row in rows]
    gen = torch.Generator().manual_seed(5)
    for size in sizes:
        for j, row in enumerate(rows):
            batch = torch.randn(size, rows.shape[1], generator=gen).to(rows.dtype)
            for pos in sorted({0, size // 2, size - 1}):
                batch[pos] = row.cpu()
            out = fn(batch.to(rows.device))
            for pos in sorted({0, size // 2, size - 1}):
                assert torch.equal(out[pos], alone[j]), (
                    f"row {j} at {pos} of {size} differs from alone: max |diff| "
                    f"{(out[pos].float() - alone[j].float()).abs().max().item():.3g}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("n", "k", "splits"), [*SPLIT_SHAPES, (160, 80, 1)])
@pytest.mark.parametrize("sm_count", [NOMINAL_SM_COUNT, FEW_SMS])
def test_a_row_is_the_same_bits_alone_and_in_any_batch(dtype: torch.dtype, n: int, k: int,
                                                       splits: int | None,
                                                       sm_count: int) -> None:
    tiles = _tiles(n, k, splits)
    x, w = _data(n, k, 3, dtype, seed=12)
    _assert_rows_invariant(lambda batch: matmul(batch, w, tiles=tiles, sm_count=sm_count), x)


def test_the_plan_splits_the_same_way_at_every_row_count() -> None:
    """matmul's own choice (no tiles given): alone and in batches the plan's split, so the
    bits agree; 65 and 130 rows under FEW_SMS run it in one program, one row apart."""
    n, k, _ = SPLIT_SHAPES[0]
    x, w = _data(n, k, 3, torch.float32, seed=13)
    assert planned_tiles(n, k, FEW_SMS).splits > 1
    _assert_rows_invariant(lambda batch: matmul(batch, w, sm_count=FEW_SMS), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_both_ways_of_running_the_splits_give_the_same_bits(dtype: torch.dtype) -> None:
    n, k, splits = SPLIT_SHAPES[1]
    tiles = _tiles(n, k, splits)
    x, w = _data(n, k, 130, dtype, seed=14)
    assert splits_in_parallel(130, n, k, tiles, 10 ** 6, x.element_size())
    assert not splits_in_parallel(130, n, k, tiles, 1, x.element_size())
    assert torch.equal(matmul(x, w, tiles=tiles, sm_count=10 ** 6),
                       matmul(x, w, tiles=tiles, sm_count=1))



def test_the_launch_is_compiled_alike_for_every_row_count(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same constexprs (tiles, split, warps) for 1 row as for 130, in either way; the
    summing kernel runs exactly when the splits ran apart, with the same constexprs."""
    gemm, summing = LaunchRecorder(), LaunchRecorder()
    monkeypatch.setattr(batch_invariant, "_matmul_kernel", gemm)
    monkeypatch.setattr(batch_invariant, "_sum_splits_kernel", summing)
    n, k = 96, 520  # two 64-wide column tiles (a split weight's, 4 warps), nine K tiles
    sms = 4  # up to 64 rows (2 tiles) the splits run apart, from 65 (4 tiles) in one program
    w = torch.zeros(n, k, device=DEVICE)  # [N, K]
    for m in BATCH_SIZES:
        matmul(torch.zeros(m, k, device=DEVICE), w, sm_count=sms)
    splits = planned_tiles(n, k, sms).splits
    assert splits > 1
    assert [grid[1] for grid, _ in gemm.launches] == [splits, splits, splits, 1, 1]
    assert all(kw == gemm.launches[0][1] for _, kw in gemm.launches)
    assert gemm.launches[0][1]["SPLITS"] == splits and gemm.launches[0][1]["BLOCK_M"] == 64
    assert len(summing.launches) == 3
    assert all(kw == summing.launches[0][1] for _, kw in summing.launches)


def test_the_split_rule_reads_only_the_weight_shape_and_the_sm_count() -> None:
    assert list(inspect.signature(matmul_tiles).parameters) == ["n", "k", "sm_count"]
    assert list(inspect.signature(split_count).parameters) == ["n_tiles", "k_tiles",
                                                               "sm_count"]


# llama-3.2-1b's weights on an H100 (132 SMs).
LLAMA_1B = {"qkv": (3072, 2048), "o_proj": (2048, 2048), "gate_up": (16384, 2048),
            "down": (2048, 8192), "lm_head": (128256, 2048)}


@pytest.mark.parametrize("name", sorted(LLAMA_1B))
def test_the_split_rule_on_llama_1b_shapes(name: str) -> None:
    n, k = LLAMA_1B[name]
    tiles = matmul_tiles(n, k, 132)
    n_tiles, k_tiles = -(-n // tiles.block_n), -(-k // tiles.block_k)
    if name in ("gate_up", "lm_head"):
        # The N tiles alone give most SMs a program: no split, no workspace.
        assert tiles.splits == 1
        return
    # A decode step (one row tile) gives three SMs in four a program at least; every split
    # covers whole K tiles, none is empty, all but the last have the same length.
    assert 4 * n_tiles * tiles.splits >= 3 * 132
    per = tiles.k_tiles_per_split
    assert per >= MIN_K_TILES_PER_SPLIT
    assert (tiles.splits - 1) * per < k_tiles <= tiles.splits * per


def test_a_split_weight_takes_narrow_column_tiles() -> None:
    # llama-3.1-8b's split projections on an H100: 64 columns and 4 warps, the split recounted
    # for twice the N tiles (QKV 3, O 5, down 5: the plans measured faster at decode sizes);
    # the wide gate/up and head keep 128 columns, unsplit.
    for (n, k), splits in {(6144, 4096): 3, (4096, 4096): 5, (4096, 14336): 5}.items():
        tiles = matmul_tiles(n, k, 132)
        assert (tiles.block_n, tiles.num_warps, tiles.splits) == (64, 4, splits), (n, k)
    for n, k in ((28672, 4096), (128256, 4096)):
        tiles = matmul_tiles(n, k, 132)
        assert (tiles.block_n, tiles.num_warps, tiles.splits) == (128, 8, 1), (n, k)


def test_the_split_rule_follows_the_sm_count_not_the_rows() -> None:
    # More SMs want more splits of the same narrow weight; a wide one stays unsplit.
    assert matmul_tiles(2048, 8192, 66).splits < matmul_tiles(2048, 8192, 132).splits
    assert matmul_tiles(16384, 2048, 66).splits == matmul_tiles(16384, 2048, 132).splits == 1
    # A K too short to give each split MIN_K_TILES_PER_SPLIT tiles is not split.
    assert matmul_tiles(64, 64 * (2 * MIN_K_TILES_PER_SPLIT - 1), 132).splits == 1


def test_each_shape_plan_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    planned_tiles.cache_clear()
    with caplog.at_level(logging.DEBUG, logger=matmul_plan.__name__):
        for _ in range(3):
            planned_tiles(2048, 8192, 132)
    lines = [r.getMessage() for r in caplog.records if r.name == matmul_plan.__name__]
    assert lines == ["batch-invariant matmul: weight 2048x8192 on 132 SMs -> 9 splits of 15 "
                     "K tiles, tiles 64x64x64, 4 warps"]


def test_the_gemm_sweep_launches_both_kernels_of_a_split_weight(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """warmup/gemm_shapes.py's sweep of a split weight, at padded eager token counts (16, 32,
    .. 512), runs the summing kernel (at the small counts) beside the matmul, each with one
    set of constexprs: every binary a served batch of that weight can launch compiles there."""
    from warmgate.server.warmup.gemm_shapes import gemm_sweep

    gemm, summing = LaunchRecorder(), LaunchRecorder()
    monkeypatch.setattr(batch_invariant, "_matmul_kernel", gemm)
    monkeypatch.setattr(batch_invariant, "_sum_splits_kernel", summing)
    weight = torch.zeros(256, 2048, device=DEVICE)  # [N, K]: 2 column tiles, 32 K tiles
    tiles = planned_tiles(256, 2048, NOMINAL_SM_COUNT)
    assert tiles.splits == 8
    ms = list(range(16, 513, 16))
    sweep = gemm_sweep(weight, ms[-1], lambda x, w: matmul(x, w, sm_count=NOMINAL_SM_COUNT))
    for m in ms:
        sweep.call(m)
    assert len(gemm.launches) == len(ms) and summing.launches
    assert {kw["SPLITS"] for _, kw in gemm.launches} == {8}
    assert all(kw == gemm.launches[0][1] for _, kw in gemm.launches)
    assert {kw["SPLITS"] for _, kw in summing.launches} == {8}
