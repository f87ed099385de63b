"""The batch-invariant matmul's per-launch row tile (matmul_plan.row_tile): an unsplit weight
launched for 128 rows or more takes 128-row tiles with 8 warps, every other launch the plan's
64 rows; a row gets the same bits alone (a 64-row tile) as inside a batch of 128-row tiles; and
the warmup's sweep of a weight launches every binary a served batch of it can launch.

Runs in the Triton interpreter on the CPU (compiled kernels when a GPU is present).
"""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

pytest.importorskip("triton")

from tests.kernel_device import kernel_device
from tests.launch_recorder import LaunchRecorder
from warmgate.server.kernels import batch_invariant, matmul_plan
from warmgate.server.kernels.batch_invariant import _matmul_kernel, matmul
from warmgate.server.kernels.matmul_plan import (
    BLOCK_M,
    NOMINAL_SM_COUNT,
    TALL_BLOCK_M,
    TALL_NUM_WARPS,
    MatmulTiles,
    device_sm_count,
    matmul_tiles,
    planned_tiles,
    row_tile,
)

DEVICE = kernel_device(_matmul_kernel)
# Unsplit: K = 80 is two K tiles, too few to split; N = 160 is two 128-column tiles (8 warps).
UNSPLIT = (160, 80)
# Unsplit with a 64-column tile, whose plan has 4 warps: the tall tile brings its own 8.
NARROW_UNSPLIT = (48, 80)
# Split: K = 520 is nine K tiles, which the plan cuts in two.
SPLIT = (48, 520)
# Around the switch: 127 is the last launch of the plan's tile, 128 the first tall one; 130
# and 300 end in a partial tall tile.
ROW_COUNTS = (1, 64, 127, 128, 130, 300)


def test_an_unsplit_weight_takes_tall_tiles_from_128_rows() -> None:
    # llama-3.1-8b's gate_up and head on an H100, and a weight whose K is too short to split.
    for n, k in ((28672, 4096), (128256, 4096), UNSPLIT, NARROW_UNSPLIT):
        plan = matmul_tiles(n, k, 132)
        assert plan.splits == 1 and plan.block_m == BLOCK_M == 64, (n, k)
        for m in (1, 64, 127):
            assert row_tile(m, plan) == (64, plan.num_warps), (n, k, m)
        for m in (128, 129, 2048, 8192):
            assert row_tile(m, plan) == (TALL_BLOCK_M, TALL_NUM_WARPS) == (128, 8), (n, k, m)


def test_a_split_weight_keeps_the_plans_tile_at_every_row_count() -> None:
    # llama-3.1-8b's QKV, O and down on an H100 (3, 5 and 5 splits), and the small SPLIT.
    for n, k in ((6144, 4096), (4096, 4096), (4096, 14336), SPLIT):
        plan = matmul_tiles(n, k, 132)
        assert plan.splits > 1, (n, k)
        for m in (1, 127, 128, 2048, 8192):
            assert row_tile(m, plan) == (64, plan.num_warps) == (64, 4), (n, k, m)


def test_an_unsplit_plan_is_logged_with_its_tall_tile(caplog: pytest.LogCaptureFixture) -> None:
    planned_tiles.cache_clear()
    with caplog.at_level(logging.DEBUG, logger=matmul_plan.__name__):
        planned_tiles(28672, 4096, 132)
        planned_tiles(4096, 14336, 132)
    lines = [r.getMessage() for r in caplog.records if r.name == matmul_plan.__name__]
    assert lines == [
        "batch-invariant matmul: weight 28672x4096 on 132 SMs -> 1 splits of 0 K tiles, "
        "tiles 64x128x64, 8 warps; from 128 rows 128-row tiles, 8 warps",
        "batch-invariant matmul: weight 4096x14336 on 132 SMs -> 5 splits of 45 K tiles, "
        "tiles 64x64x64, 4 warps"]



def _launches(monkeypatch: pytest.MonkeyPatch, n: int, k: int, ms: tuple[int, ...],
              tiles: MatmulTiles | None = None) -> list[tuple[tuple[int, ...], dict[str, object]]]:
    gemm = LaunchRecorder()
    monkeypatch.setattr(batch_invariant, "_matmul_kernel", gemm)
    monkeypatch.setattr(batch_invariant, "_sum_splits_kernel", LaunchRecorder())
    w = torch.zeros(n, k, device=DEVICE)  # [N, K]
    for m in ms:
        matmul(torch.zeros(m, k, device=DEVICE), w, tiles=tiles, sm_count=NOMINAL_SM_COUNT)
    return gemm.launches


@pytest.mark.parametrize("shape", [UNSPLIT, NARROW_UNSPLIT])
def test_the_launch_takes_the_row_tile_of_its_row_count(monkeypatch: pytest.MonkeyPatch,
                                                        shape: tuple[int, int]) -> None:
    """Two binaries per unsplit weight (64-row tiles under 128 rows, 128-row tiles with 8 warps
    from there), the grid counting tiles of that height, everything else the plan's."""
    n, k = shape
    plan = planned_tiles(n, k, NOMINAL_SM_COUNT)
    launches = _launches(monkeypatch, n, k, ROW_COUNTS)
    for m, (grid, kw) in zip(ROW_COUNTS, launches, strict=True):
        block_m, warps = (128, 8) if m >= 128 else (64, plan.num_warps)
        assert (kw["BLOCK_M"], kw["num_warps"]) == (block_m, warps), m
        assert grid == (-(-m // block_m) * -(-n // plan.block_n), 1), m
        others = {key: v for key, v in kw.items() if key not in ("BLOCK_M", "num_warps")}
        assert others == {key: v for key, v in launches[0][1].items()
                          if key not in ("BLOCK_M", "num_warps")}, m
    assert len({(kw["BLOCK_M"], kw["num_warps"]) for _, kw in launches}) == 2


def test_a_split_weight_launches_one_binary_at_every_row_count(
        monkeypatch: pytest.MonkeyPatch) -> None:
    launches = _launches(monkeypatch, *SPLIT, ROW_COUNTS)
    assert planned_tiles(*SPLIT, NOMINAL_SM_COUNT).splits > 1
    assert all(kw == launches[0][1] for _, kw in launches)
    assert (launches[0][1]["BLOCK_M"], launches[0][1]["num_warps"]) == (64, 4)


def test_given_tiles_are_launched_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    # What the GPU bench's columns rely on: the plan's 64-row tile forced at 300 rows, and a
    # 128-row tile forced at 1.
    plan = planned_tiles(*UNSPLIT, NOMINAL_SM_COUNT)
    tall = dataclasses.replace(plan, block_m=128)
    short_at_300 = _launches(monkeypatch, *UNSPLIT, (300,), tiles=plan)
    tall_at_1 = _launches(monkeypatch, *UNSPLIT, (1,), tiles=tall)
    assert short_at_300[0][1]["BLOCK_M"] == 64 and short_at_300[0][0] == (5 * 2, 1)
    assert tall_at_1[0][1]["BLOCK_M"] == 128


def _data(rows: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    n, k = UNSPLIT
    x = torch.randn(rows, k, generator=gen).to(DEVICE, dtype)  # [M, K]
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(DEVICE, dtype)  # [N, K]
    return x, w


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_alone_is_the_same_bits_inside_tall_tiles(dtype: torch.dtype) -> None:
    """The server's launch (no tiles given): each row alone runs a 64-row tile; inside
    batches of 128, 130 and 200 rows, 128-row tiles, at the first, middle and last row of a
    tall tile and in a partial one."""
    x, w = _data(3, dtype, seed=21)
    plan = planned_tiles(*UNSPLIT, device_sm_count(x.device))
    assert row_tile(1, plan)[0] == 64
    alone = [matmul(x[j:j + 1], w)[0] for j in range(x.shape[0])]
    gen = torch.Generator().manual_seed(22)
    for size in (128, 130, 200):
        assert row_tile(size, plan)[0] == 128
        for j in range(x.shape[0]):
            batch = torch.randn(size, x.shape[1], generator=gen).to(DEVICE, dtype)
            positions = sorted({0, 63, 64, 127, size - 1} | ({128} if size > 128 else set()))
            batch[positions] = x[j]
            out = matmul(batch, w)
            for pos in positions:
                assert torch.equal(out[pos], alone[j]), (
                    f"row {j} at {pos} of {size} differs from alone: max |diff| "
                    f"{(out[pos].float() - alone[j].float()).abs().max().item():.3g}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tall_tiles_give_the_plans_bits_for_a_whole_batch(dtype: torch.dtype) -> None:
    # The bench's "BLOCK_M 128 == 64" check, here: one batch both ways, every element.
    x, w = _data(200, dtype, seed=23)
    plan = planned_tiles(*UNSPLIT, device_sm_count(x.device))
    tall = dataclasses.replace(plan, block_m=TALL_BLOCK_M, num_warps=TALL_NUM_WARPS)
    assert torch.equal(matmul(x, w, tiles=plan), matmul(x, w, tiles=tall))
    assert torch.equal(matmul(x, w), matmul(x, w, tiles=tall))


def test_the_gemm_sweep_compiles_both_row_tiles_of_an_unsplit_weight(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """warmup/gemm_shapes.py's sweep runs a weight at every token count a forward can run at
    outside a CUDA graph (here the padded eager counts 16, 32, .. 512), so an unsplit weight's
    64-row binary compiles at the counts under 128 and its 128-row one from 128: every binary
    a served batch of 1..512 tokens can launch is among those the sweep launched. (A count a
    CUDA graph holds is compiled by the eager run before its capture, runner/cuda_graphs.py.)"""
    from warmgate.server.warmup.gemm_shapes import gemm_sweep

    def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return matmul(x, w, sm_count=NOMINAL_SM_COUNT)

    gemm = LaunchRecorder()
    monkeypatch.setattr(batch_invariant, "_matmul_kernel", gemm)
    n, k = UNSPLIT
    weight = torch.zeros(n, k, device=DEVICE)  # [N, K]
    sweep = gemm_sweep(weight, 512, linear)
    for m in range(16, 513, 16):
        sweep.call(m)
    swept = [tuple(sorted(kw.items())) for _, kw in gemm.launches]
    assert {dict(kw)["BLOCK_M"] for kw in swept} == {64, 128}
    gemm.launches.clear()
    for m in range(1, 513):
        linear(torch.zeros(m, k, device=DEVICE), weight)
    served = {tuple(sorted(kw.items())) for _, kw in gemm.launches}
    assert served == set(swept)
