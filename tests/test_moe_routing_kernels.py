"""The MoE routing kernels against the torch versions they replace on CUDA, through the Triton
interpreter on the CPU: the router's softmax/top-k/renormalise (kernels.moe_route) and the
rows' alignment by expert (kernels.moe_align), element for element, on expert counts that are
not powers of two and row counts that cross the kernel's chunks.

On a machine with CUDA the interpreter is not forced and the same checks run on the GPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from tests.kernel_device import kernel_device
from warmgate.server.kernels.fused_moe import align_by_expert_torch, sum_slots
from warmgate.server.kernels.moe_align import _align_kernel, align_rows
from warmgate.server.kernels.moe_route import route_topk
from warmgate.server.runner.moe import route

DEVICE = kernel_device(_align_kernel)


def _ids(tokens: int, experts: int, top_k: int, seed: int) -> torch.Tensor:
    """Each token's top_k distinct experts, skewed so some experts get many rows, some none."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.rand(tokens, experts, generator=gen) * torch.linspace(1, 3, experts)
    return scores.topk(top_k, dim=-1).indices.to(DEVICE)


@pytest.mark.parametrize(("tokens", "experts", "top_k", "block_m"), [
    (1, 128, 8, 16),  # Qwen3-30B-A3B decode: 8 rows, 120 experts empty
    (3, 4, 2, 4),
    (45, 6, 2, 16),  # more rows than a chunk of the 8-expert case? no: several tiles each
    (300, 60, 4, 32),  # 1,200 rows: several chunks of 128, experts not a power of two
    (256, 8, 2, 64),  # Mixtral-like
])
def test_the_alignment_kernel_equals_the_torch_version(tokens: int, experts: int, top_k: int,
                                                        block_m: int) -> None:
    ids = _ids(tokens, experts, top_k, seed=tokens)
    want = align_by_expert_torch(ids, experts, block_m)
    got = align_rows(ids, experts, block_m)
    for name, w, g in zip(("sorted_rows", "tile_experts", "num_padded"), want, got,
                          strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        assert torch.equal(g, w), name


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize(("tokens", "experts", "top_k"), [(1, 128, 8), (17, 60, 4), (5, 8, 2),
                                                          (3, 6, 1)])
def test_the_routing_kernel_equals_the_torch_route(tokens: int, experts: int, top_k: int,
                                                    renormalize: bool) -> None:
    gen = torch.Generator().manual_seed(experts + tokens)
    logits = (torch.randn(tokens, experts, generator=gen) * 3).to(DEVICE)
    want_w, want_i = route(logits, top_k, renormalize)
    got_w, got_i = route_topk(logits, top_k, renormalize)
    assert got_i.dtype == torch.int64 and got_w.dtype == torch.float32
    assert torch.equal(got_i, want_i)  # the same experts, largest first
    torch.testing.assert_close(got_w, want_w, rtol=1e-6, atol=1e-7)


def test_a_tie_picks_the_lower_expert_first() -> None:
    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0, 2.0]], device=DEVICE)
    weights, ids = route_topk(logits, 2, renormalize=True)
    assert ids.tolist() == [[1, 3]]
    torch.testing.assert_close(weights, torch.full((1, 2), 0.5, device=DEVICE))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("tokens", "top_k", "hidden"), [(1, 8, 2048), (5, 2, 48), (3, 3, 1100)])
def test_each_tokens_rows_are_summed_in_float32(tokens: int, top_k: int, hidden: int,
                                                dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(tokens)
    rows = torch.randn(tokens, top_k, hidden, generator=gen).to(DEVICE, dtype)
    want = rows.float().sum(dim=1).to(dtype)
    got = sum_slots(rows)
    assert got.dtype == dtype and got.shape == (tokens, hidden)
    # float32 sums in another order; bf16 within one of its ulps (the interpreter's cast to
    # bf16 truncates where the GPU's rounds).
    tol = 1e-6 if dtype == torch.float32 else 2 ** -7
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
