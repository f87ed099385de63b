"""The sampler's per-row softmax and cumsum kernels (kernels/row_reductions.py): close to
torch's, and a row the same bits alone as at any position of batches of several sizes beside
random rows, -inf-masked rows and lengths that are not a multiple of the chunk included.

Runs in the Triton interpreter on the CPU (compiled kernels when a GPU is present).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

pytest.importorskip("triton")

from tests.kernel_device import kernel_device
from warmgate.server.kernels import row_reductions
from warmgate.server.kernels.row_reductions import ROW_BLOCK, row_cumsum, row_softmax

DEVICE = kernel_device(row_reductions._row_softmax_kernel)
BATCH_SIZES = (2, 5, 9)
# A small chunk walks a row of a few hundred columns in several chunks (and a partial last
# one); ROW_BLOCK is what the sampler runs.
BLOCKS = (128, ROW_BLOCK)
LENGTHS = (1, 300, 1500)  # one column, under a chunk, several chunks; none a multiple
RowOp = Callable[[torch.Tensor], torch.Tensor]


def _logits(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Random logits, with every third row keeping only a random ~30 % of its columns (the
    rest -inf, as top-k and min_p leave them) and at least its first column finite."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=gen) * 3
    dropped = torch.rand(rows, cols, generator=gen) > 0.3
    dropped[:, 0] = False
    x[::3] = x[::3].masked_fill(dropped[::3], float("-inf"))
    return x.to(DEVICE)


def _probabilities(rows: int, cols: int, seed: int) -> torch.Tensor:
    """What the sampler cumsums: a softmax's rows, some with zeros (masked tokens)."""
    return torch.softmax(_logits(rows, cols, seed), dim=-1)


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("cols", LENGTHS)
def test_row_softmax_matches_torch(block: int, cols: int) -> None:
    x = _logits(7, cols, seed=cols)
    out = row_softmax(x, block=block)
    assert out.dtype == torch.float32 and out.shape == x.shape
    torch.testing.assert_close(out, torch.softmax(x, dim=-1), rtol=1e-5, atol=1e-7)
    assert torch.equal(out == 0, x == float("-inf"))  # -inf gives exactly 0, nothing else
    # bf16 logits are read and reduced in float32.
    torch.testing.assert_close(row_softmax(x.bfloat16(), block=block),
                               torch.softmax(x.bfloat16().float(), dim=-1),
                               rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("cols", LENGTHS)
def test_row_cumsum_matches_torch(block: int, cols: int) -> None:
    p = _probabilities(7, cols, seed=cols + 1)
    out = row_cumsum(p, block=block)
    assert out.dtype == torch.float32 and out.shape == p.shape
    torch.testing.assert_close(out, p.cumsum(dim=-1), rtol=1e-5, atol=1e-6)
    # Probabilities' running mass never steps back, inside a chunk (the GPU's tree-shaped scan
    # rounds neighbours apart) and across chunk boundaries.
    assert bool((out[:, 1:] >= out[:, :-1]).all())
    # Nonnegative values over six decades: within float32 rounding of the float64 sums (a sum
    # of n terms rounds at most n - 1 times, each within 2**-24 of the running total).
    g = torch.Generator().manual_seed(2)
    wide = (10.0 ** (6 * torch.rand(4, cols, generator=g) - 3)).to(DEVICE)
    err = (row_cumsum(wide, block=block).double() - wide.double().cumsum(dim=-1)).abs()
    assert bool((err <= cols * 2.0**-24 * wide.double().cumsum(dim=-1)).all())


def _assert_rows_invariant(op: RowOp, rows: torch.Tensor, make_batch: Callable[
        [int, int], torch.Tensor]) -> None:
    """Each row of `rows` [R, W] gets from op the same bits alone as at the first, a middle
    and the last position of batches of every size, beside rows from make_batch(size, seed)."""
    alone = [op(row.unsqueeze(0).clone())[0] for row in rows]
    for size in BATCH_SIZES:
        for j, row in enumerate(rows):
            batch = make_batch(size, 100 * size + j)
            positions = sorted({0, size // 2, size - 1})
            for pos in positions:
                batch[pos] = row
            out = op(batch)
            for pos in positions:
                assert torch.equal(out[pos], alone[j]), (
                    f"row {j} at {pos} of {size} differs from alone: max |diff| "
                    f"{(out[pos] - alone[j]).abs().max().item():.3g}")


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("cols", LENGTHS[1:])
def test_a_softmax_row_is_the_same_bits_alone_and_in_any_batch(block: int, cols: int) -> None:
    rows = _logits(3, cols, seed=7)  # row 0 is -inf-masked
    _assert_rows_invariant(lambda x: row_softmax(x, block=block), rows,
                           lambda size, seed: _logits(size, cols, seed))


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("cols", LENGTHS[1:])
def test_a_cumsum_row_is_the_same_bits_alone_and_in_any_batch(block: int, cols: int) -> None:
    rows = _probabilities(3, cols, seed=8)  # row 0 has zeros where its logits were -inf
    _assert_rows_invariant(lambda x: row_cumsum(x, block=block), rows,
                           lambda size, seed: _probabilities(size, cols, seed))


def test_trailing_masked_columns_do_not_change_a_rows_bits() -> None:
    """The warpers' top-k width is the batch's largest k: a row's kept tokens then sit in a
    wider row, the rest -inf (softmax) or 0 (cumsum). Its leading columns keep their bits."""
    kept = _logits(2, 90, seed=9)
    for width in (200, 1500):
        padded = torch.full((2, width), float("-inf"), device=DEVICE)
        padded[:, :90] = kept
        for block in BLOCKS:
            assert torch.equal(row_softmax(padded, block=block)[:, :90],
                               row_softmax(kept, block=block))
            p = row_softmax(kept, block=block)
            p_padded = torch.zeros((2, width), device=DEVICE)
            p_padded[:, :90] = p
            assert torch.equal(row_cumsum(p_padded, block=block)[:, :90],
                               row_cumsum(p, block=block))


def test_a_strided_view_and_empty_inputs() -> None:
    x = _logits(4, 600, seed=10)
    view = x[:, ::2]  # not unit stride: copied, same result as its dense copy
    assert torch.equal(row_softmax(view), row_softmax(view.contiguous()))
    assert torch.equal(row_cumsum(view.abs()), row_cumsum(view.abs().contiguous()))
    assert row_softmax(x[:0]).shape == (0, 600)
    assert row_cumsum(x[:, :0]).shape == (4, 0)


def test_bad_shapes_and_dtypes_are_refused_with_the_op_named() -> None:
    with pytest.raises(ValueError, match=r"row_softmax: x \(3,\) is not"):
        row_softmax(torch.zeros(3, device=DEVICE))
    with pytest.raises(ValueError, match=r"row_cumsum: x is torch\.int64"):
        row_cumsum(torch.zeros(2, 3, dtype=torch.long, device=DEVICE))
