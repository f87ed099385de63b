"""The batch-invariant kernels: right within float32 tolerance, and bit for bit batch invariant.

A row is computed alone and then inside batches of several sizes, at several positions and
beside several different other rows; its result must be the same bits every time. Beside
them, the default float32 torch.matmul on this CPU (MKL/oneDNN) is shown to give a row other
bits alone than inside a batch, so the invariance asserted here is not a property every kernel
has for free.

Runs in the Triton interpreter on the CPU (compiled kernels when a GPU is present).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

pytest.importorskip("triton")

from triton.runtime.interpreter import InterpretedFunction

from tests.paged_reference import rel_err, tolerance
from warmgate.server.kernels import batch_invariant
from warmgate.server.kernels.batch_invariant import (
    _matmul_kernel,
    log_softmax,
    matmul,
    matmul_tiles,
    rms_norm,
)

DEVICE = "cpu" if isinstance(_matmul_kernel, InterpretedFunction) else "cuda"
# Batch sizes around the target rows: small, decode-sized, odd (alone is the reference). The
# matmul adds one past its 64-row M tile; the row-wise kernels have no tile across rows.
BATCH_SIZES = (3, 8, 33)
MATMUL_BATCH_SIZES = (*BATCH_SIZES, 72)
EPS = 1e-6


def _batch(targets: torch.Tensor, size: int, seed: int) -> tuple[torch.Tensor, dict[int, int]]:
    """A [size, W] batch of random rows drawn from `seed`, all but one of them (at most all the
    targets) replaced by target rows at random positions. Returns it and {position: target}."""
    gen = torch.Generator().manual_seed(seed)
    batch = torch.randn(size, targets.shape[1], generator=gen).to(targets.dtype)  # [size, W]
    count = min(targets.shape[0], size - 1)
    positions = torch.randperm(size, generator=gen)[:count].tolist()
    shift = seed * 3  # which targets land in which batch differs between fillers
    placed = {pos: (j + shift) % targets.shape[0] for j, pos in enumerate(positions)}
    for pos, t in placed.items():
        batch[pos] = targets[t]
    return batch.to(DEVICE), placed


def _assert_invariant(fn: Callable[[torch.Tensor], torch.Tensor], targets: torch.Tensor,
                      sizes: tuple[int, ...] = BATCH_SIZES) -> None:
    """Each target row [W] of `targets` [R, W] gets from fn the same bits alone (a batch of 1)
    as inside every batch of `sizes` rows, at any position, beside two sets of other rows.

    Many targets, because a reduction reordered by the batch changes the rounded result of
    only some rows: about one log-softmax row in sixteen, one RMSNorm row in eight."""
    alone = [fn(row.unsqueeze(0).to(DEVICE))[0] for row in targets]
    for seed in (1, 2):
        for size in sizes:
            batch, placed = _batch(targets, size, seed)
            out = fn(batch)
            for pos, t in placed.items():
                assert torch.equal(out[pos], alone[t]), (
                    f"target {t} at row {pos} of {size} (filler seed {seed}) differs from "
                    f"alone: max |diff| "
                    f"{(out[pos].float() - alone[t].float()).abs().max().item():.3g}")


# ---------------------------------------------------------------- matmul

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("n", "k"), [(48, 80), (160, 40)])
def test_matmul_matches_torch(dtype: torch.dtype, n: int, k: int) -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(33, k, generator=gen).to(DEVICE, dtype)  # [M, K]
    w = torch.randn(n, k, generator=gen).to(DEVICE, dtype)  # [N, K]
    out = matmul(x, w)
    assert out.shape == (33, n) and out.dtype == dtype
    assert rel_err(out, x.float() @ w.float().T) <= tolerance(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmul_row_is_batch_invariant(dtype: torch.dtype) -> None:
    # K = 80 spans two K tiles and N = 160 two N tiles, so the order of the K loop matters.
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(160, 80, generator=gen).to(DEVICE, dtype)  # [N, K]
    rows = torch.randn(8, 80, generator=gen).to(dtype)  # [R, K]
    _assert_invariant(lambda batch: matmul(batch, w), rows, MATMUL_BATCH_SIZES)


def test_matmul_launch_ignores_the_row_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every compile-time choice of the launch (tiles, warps, stages, dot flags) is the same for
    1 row as for 72: under the 128 rows from which an unsplit weight's launch takes taller row
    tiles (tests/test_batch_invariant_row_tile.py). On the GPU another tile is another
    instruction schedule; the interpreter's per-tile products would hide that, so the launch
    itself is recorded."""
    launches: list[dict[str, object]] = []

    class Recorder:
        def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
            def launch(*args: object, **kwargs: object) -> None:
                launches.append(kwargs)
            return launch

    monkeypatch.setattr(batch_invariant, "_matmul_kernel", Recorder())
    w = torch.zeros(160, 80, device=DEVICE)  # [N, K]
    for m in MATMUL_BATCH_SIZES:
        matmul(torch.zeros(m, 80, device=DEVICE), w)
    assert len(launches) == len(MATMUL_BATCH_SIZES)
    assert all(kw == launches[0] for kw in launches), launches
    tiles = matmul_tiles(160, 80)
    assert (tiles.block_m, tiles.block_n, tiles.block_k) == (64, 128, 64)
    assert launches[0]["BLOCK_M"] == tiles.block_m


def test_default_torch_matmul_is_not_batch_invariant_here() -> None:
    """The same row through float32 torch.matmul alone (a GEMV) and inside a batch of 33 (a
    GEMM) rounds differently on this CPU: what the invariance tests above rule out."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(33, 64, generator=gen)  # [M, K]
    w = torch.randn(96, 64, generator=gen)  # [N, K]
    alone = x[:1] @ w.T
    in_batch = (x @ w.T)[:1]
    assert not torch.equal(alone, in_batch)
    # Only rounding, not a wrong result: the difference is what batch invariance removes.
    assert rel_err(alone, in_batch) <= tolerance(torch.float32)
    # Our kernel on the same data gives the same bits both ways.
    assert torch.equal(matmul(x[:1].to(DEVICE), w.to(DEVICE)),
                       matmul(x.to(DEVICE), w.to(DEVICE))[:1])


def test_matmul_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="not \\[M, K\\] and \\[N, K\\]"):
        matmul(torch.zeros(2, 8, device=DEVICE), torch.zeros(4, 6, device=DEVICE))


# ---------------------------------------------------------------- RMSNorm

@pytest.mark.parametrize(("dtype", "with_residual"), [
    (torch.float32, False), (torch.bfloat16, True)])
def test_rms_norm_row_is_batch_invariant(dtype: torch.dtype, with_residual: bool) -> None:
    hidden = 1000  # not a power of two: the masked tail is part of the row's reduction
    gen = torch.Generator().manual_seed(6)
    weight = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(DEVICE, dtype)
    rows = torch.randn(32, hidden, generator=gen).to(dtype)  # [R, H]

    def norm(batch: torch.Tensor) -> torch.Tensor:
        # The residual is a fixed function of the row, so both inputs move together.
        residual = 0.5 * batch.flip(-1) if with_residual else None
        out, new_residual = rms_norm(batch, weight, EPS, residual)
        s = batch.float() if residual is None else (batch.float() + residual.float())
        ref = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + EPS) * weight.float()
        assert rel_err(out, ref) <= tolerance(dtype)
        return torch.cat([out, new_residual], dim=-1)

    _assert_invariant(norm, rows)


# ---------------------------------------------------------------- log-softmax

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_log_softmax_matches_torch(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(7)
    # 5000 > one 4096-wide chunk; -inf entries (masked tokens) must stay -inf, not NaN.
    logits = (4 * torch.randn(6, 5000, generator=gen)).to(dtype)
    logits[2, :4500] = float("-inf")
    out = log_softmax(logits.to(DEVICE))
    ref = torch.log_softmax(logits.float(), dim=-1)
    assert out.dtype == torch.float32 and out.shape == logits.shape
    finite = ref.isfinite()
    assert torch.equal(out.isfinite().cpu(), finite)
    assert rel_err(out.cpu()[finite], ref[finite]) <= 1e-5


def test_log_softmax_row_is_batch_invariant() -> None:
    gen = torch.Generator().manual_seed(8)
    rows = 4 * torch.randn(16, 5000, generator=gen)  # [R, V], V over one 4096 chunk
    _assert_invariant(log_softmax, rows)
