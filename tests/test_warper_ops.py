"""The warpers' top-k under --deterministic (sampling/warper_ops.py canonical_top): the values
torch.topk finds, in one order (largest first, equal values by lower index), so a row's
first k entries never depend on the width asked for."""

from __future__ import annotations

import torch

from warmgate.server.runner.sampling.warper_ops import TORCH_WARPER_OPS, canonical_top

INF = float("inf")


def test_ties_come_by_lower_index_and_minus_inf_last() -> None:
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0, -INF, 0.0, -2.0, -2.0]])
    values, indices = canonical_top(x, 4)
    assert values.tolist() == [[3.0, 3.0, 3.0, 2.0]]
    assert indices.tolist() == [[1, 2, 4, 3]]
    values, indices = canonical_top(x, 9)  # the whole row: the sort
    assert indices.tolist() == [[1, 2, 4, 3, 0, 6, 7, 8, 5]]
    assert torch.equal(values, x.gather(-1, indices))


def test_the_first_k_are_the_same_for_every_width() -> None:
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(5, 400, generator=gen) * 4).round() / 4  # steps of 0.25: many ties
    x[1, ::7] = -INF
    x[2, :10] = -0.0
    full_v, full_i = canonical_top(x, 400)
    for k in (1, 20, 64, 399):
        v, i = canonical_top(x, k)
        assert torch.equal(v, full_v[:, :k]) and torch.equal(i, full_i[:, :k])
    # Largest first; equal values by increasing index.
    assert bool((full_v[:, 1:] <= full_v[:, :-1]).all())
    same = full_v[:, 1:] == full_v[:, :-1]
    assert bool((full_i[:, 1:][same] > full_i[:, :-1][same]).all())
    assert torch.equal(full_v, x.sort(dim=-1, descending=True).values)


def test_without_ties_it_is_torch_topk() -> None:
    x = torch.randn(6, 1000, generator=torch.Generator().manual_seed(4)) * 3
    for width in (50, 1000):
        want = TORCH_WARPER_OPS.top(x, width)
        got = canonical_top(x, width)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # bf16 logits are ranked by their float32 values.
    v, i = canonical_top(x.bfloat16(), 30)
    assert v.dtype == torch.bfloat16
    assert torch.equal(v, x.bfloat16().gather(-1, i))
    assert torch.equal(v.float(), x.bfloat16().float().topk(30).values)
