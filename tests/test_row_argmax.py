"""The sampler's chunked argmax (kernels/row_argmax.py): torch.argmax's index on every row,
ties to the first, a NaN above every number, rows of only -inf, lengths that are not a
multiple of the chunk, and more chunks than the fold takes at once; its workspace's counts
left zero for the next launch, whatever batch came before.

Runs in the Triton interpreter on the CPU (compiled kernels when a GPU is present).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from tests.kernel_device import kernel_device
from tests.probe_run import run_probe
from warmgate.server.kernels import row_argmax as module
from warmgate.server.kernels.row_argmax import row_argmax

DEVICE = kernel_device(module._row_argmax_kernel)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# (columns, chunk): one column; under a chunk; several chunks and a partial last one; more
# chunks (70) than the fold's 64 at once; a vocabulary's row in the server's chunk.
SHAPES = ((1, 128), (300, 128), (1500, 128), (8900, 128), (50_000, module.CHUNK))


def _rows(cols: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Six rows that each test one rule: random; the largest value twice, in two chunks; only
    -inf; two NaNs behind a +inf; values rounded to a few integers (ties everywhere); the
    largest in the last column."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(6, cols, generator=gen) * 3
    x[1, cols // 3] = x[1, -1] = x[1].max() + 1
    x[2] = float("-inf")
    x[3, 0] = float("inf")
    x[3, cols // 2] = x[3, -1] = float("nan")
    x[4] = x[4].clamp(-2, 2).round()
    x[5, -1] = x[5].max() + 1
    return x.to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("cols", "chunk"), SHAPES)
def test_row_argmax_is_torch_argmax(dtype: torch.dtype, cols: int, chunk: int) -> None:
    x = _rows(cols, dtype, seed=cols)
    got = row_argmax(x, chunk=chunk)
    assert got.dtype == torch.int64 and got.shape == (6,)
    assert got.tolist() == x.argmax(dim=-1).tolist()


def test_row_argmax_leaves_its_counts_zero_across_batches_and_lengths() -> None:
    """The last program of each row sets its count back: batches of other sizes and lengths,
    one after the other on one workspace (grown between them), each get torch's indices."""
    module._WORKSPACES.clear()
    for rows, cols in ((2, 900), (5, 300), (3, 1500), (6, 200)):
        x = _rows(cols, torch.float32, seed=rows)[:rows]  # _rows makes six
        assert row_argmax(x, chunk=128).tolist() == x.argmax(dim=-1).tolist()
        assert int(module._WORKSPACES[x.device].counts.abs().sum()) == 0


def test_row_argmax_reads_a_strided_view_and_an_empty_batch() -> None:
    x = _rows(600, torch.float32, seed=1)
    view = x[:, ::2]  # every second column: not contiguous
    assert row_argmax(view, chunk=128).tolist() == view.argmax(dim=-1).tolist()
    assert row_argmax(x[:0], chunk=128).shape == (0,)


def test_row_argmax_refuses_what_has_no_largest_value() -> None:
    with pytest.raises(ValueError, match="no columns"):
        row_argmax(torch.empty(2, 0, device=DEVICE))
    with pytest.raises(ValueError, match="floating-point"):
        row_argmax(torch.zeros(2, 3, dtype=torch.int64, device=DEVICE))


def test_row_argmax_compiles_for_hopper_without_spills() -> None:
    """The kernel compiles for sm_90 in every dtype the sampler gives it, no register spilled
    to local memory."""
    reports = run_probe("tests.argmax_compile_probe")
    assert [r["kernel"] for r in reports] == ["_row_argmax_kernel"] * 3  # one a dtype
    assert all(r["STACK"] == 0 for r in reports), reports
