"""The fused MoE router (kernels.moe_router: the router projection, softmax, top-k and
renormalisation in one launch) against the two steps it replaces, F.linear then
runner.moe.route, through the Triton interpreter on the CPU (on the GPU with CUDA).

The launch's programs each store a partial of the logits and count themselves in; the last
of a token's routes it and sets the count back to zero, which is what lets a captured graph
replay the launch: every test calls it more than once on one count buffer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from tests.kernel_device import kernel_device
from warmgate.server.config.runner_config import ModelConfig
from warmgate.server.kernels.moe_router import (
    MAX_TOKENS,
    _router_kernel,
    counts_for,
    norm_router_applies,
    norm_router_top_k,
    router_applies,
    router_top_k,
)
from warmgate.server.kernels.ops import TritonOps
from warmgate.server.kernels.rms_norm import rms_norm
from warmgate.server.runner.moe import MoEBlock, route, torch_moe

DEVICE = kernel_device(_router_kernel)


def _inputs(tokens: int, experts: int, hidden: int, dtype: torch.dtype, seed: int
            ) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen)
    w = torch.randn(experts, hidden, generator=gen) * 2 / hidden ** 0.5
    return x.to(DEVICE, dtype), w.to(DEVICE, dtype)


def _blocks(seed: int) -> tuple[MoEBlock, MoEBlock]:
    """Two Mixtral-shaped MoE blocks with the same random weights and the torch experts:
    routed by F.linear then route, and by the fused router."""
    config = ModelConfig(architecture="mixtral", hidden_size=48, num_experts=8,
                         num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)
    device = torch.device(DEVICE)
    reference = MoEBlock(config, device, torch.float32, experts=torch_moe, fused_router=False)
    fused = MoEBlock(config, device, torch.float32, experts=torch_moe, fused_router=True)
    gen = torch.Generator().manual_seed(seed)
    for a, b in zip(reference.parameters(), fused.parameters(), strict=True):
        a.copy_(torch.randn(a.shape, generator=gen) / a.shape[-1] ** 0.5)
        b.copy_(a)
    return reference, fused


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize(("tokens", "experts", "hidden", "top_k"), [
    (1, 128, 2048, 8),  # Qwen3-30B-A3B at batch 1: 32 expert tiles x 4 K splits
    (3, 60, 1100, 4),  # experts not a power of two, a K split that ends part way
    (MAX_TOKENS, 8, 4096, 2),  # Mixtral's router shape
])
def test_the_fused_router_routes_as_linear_then_route(tokens: int, experts: int, hidden: int,
                                                       top_k: int, renormalize: bool) -> None:
    x, w = _inputs(tokens, experts, hidden, torch.float32, seed=tokens + experts)
    want_w, want_i = route(F.linear(x, w), top_k, renormalize)
    counts = counts_for(torch.device(DEVICE))
    for _ in range(2):  # the second launch runs on the counts the first left
        got_w, got_i = router_top_k(x, w, counts, top_k, renormalize)
        assert got_i.dtype == torch.int64 and got_w.dtype == torch.float32
        assert torch.equal(got_i, want_i)
        torch.testing.assert_close(got_w, want_w, rtol=1e-5, atol=1e-6)
        assert counts.tolist() == [0] * MAX_TOKENS


def test_the_logits_are_rounded_to_the_model_dtype_before_the_softmax() -> None:
    """bf16 rows and weights whose products and sums are exact in float32 (multiples of 1/16,
    far from its precision), with logits in [64, 128), where bf16 keeps halves: each expert's
    logit loses 0, 1/16, 1/8 or 3/16 to the rounding (below half of bf16's step there, so the
    interpreter's truncating cast rounds as torch's does), which moves its softmax weight by up
    to 20 %: the kernel's weights are F.linear's bit for bit only if it rounds as F.linear."""
    gen = torch.Generator().manual_seed(1)
    experts = torch.arange(12, dtype=torch.float32)
    x = torch.randint(-1, 2, (4, 8), generator=gen).float()
    w = torch.randint(-1, 2, (12, 8), generator=gen).float()
    x[:, :2] = 1
    w[:, 0] = 80
    w[:, 1] = 0.5 * experts + 0.0625 * (experts % 4)  # exact in bf16 (7 significant bits)
    x, w = x.to(DEVICE, torch.bfloat16), w.to(DEVICE, torch.bfloat16)
    logits = F.linear(x, w)
    assert (logits.float() != F.linear(x.float(), w.float())).any()  # the rounding shows
    top = logits.float().sort(dim=-1, descending=True).values[:, :4]
    assert (top[:, :-1] != top[:, 1:]).all()  # no tie among the picks: one right answer
    want_w, want_i = route(logits, 3, True)
    got_w, got_i = router_top_k(x, w, counts_for(torch.device(DEVICE)), 3, True)
    assert torch.equal(got_i, want_i)
    torch.testing.assert_close(got_w, want_w, rtol=1e-6, atol=1e-7)


def test_a_nan_row_names_the_lowest_experts_and_leaves_the_others_alone() -> None:
    """A captured graph's padding rows hold whatever their buffers held: their routing must
    still name real experts, and the real tokens' routing stays theirs."""
    x, w = _inputs(3, 16, 64, torch.float32, seed=2)
    x[1] = float("nan")
    weights, ids = router_top_k(x, w, counts_for(torch.device(DEVICE)), 2, True)
    assert ids[1].tolist() == [0, 1] and weights[1].isnan().all()
    keep = torch.tensor([0, 2], device=DEVICE)
    want_w, want_i = route(F.linear(x[keep], w), 2, True)
    assert torch.equal(ids[keep], want_i)
    torch.testing.assert_close(weights[keep], want_w, rtol=1e-5, atol=1e-6)


def test_a_tokens_routing_does_not_depend_on_the_others() -> None:
    """Fixed splits, added in a fixed order: a token routed alone gets the bits it gets in a
    batch (the router of --deterministic needs nothing else)."""
    x, w = _inputs(5, 24, 300, torch.float32, seed=9)
    counts = counts_for(torch.device(DEVICE))
    batch_w, batch_i = router_top_k(x, w, counts, 4, False)
    for t in range(5):
        alone_w, alone_i = router_top_k(x[t:t + 1], w, counts, 4, False)
        assert torch.equal(alone_w[0], batch_w[t]) and torch.equal(alone_i[0], batch_i[t])


def test_what_it_does_not_take_is_refused_and_a_moe_block_routes_it_the_other_way() -> None:
    x, w = _inputs(MAX_TOKENS + 1, 8, 48, torch.float32, seed=1)
    assert router_applies(x[:MAX_TOKENS], w)
    assert not router_applies(x, w)  # too many tokens
    assert not router_applies(x[:2].to(torch.bfloat16), w)  # another dtype
    assert not router_applies(x[:2, :40], w)  # another width
    with pytest.raises(ValueError, match="router_top_k"):
        router_top_k(x, w, counts_for(torch.device(DEVICE)), 2, True)
    reference, fused = _blocks(seed=4)
    calls: list[int] = []
    kernel = _router_kernel.run

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return kernel(*args, **kwargs)

    _router_kernel.run = counted  # type: ignore[method-assign]
    try:
        for tokens in (3, MAX_TOKENS + 1):  # fused, then cuBLAS and the routing kernel
            torch.testing.assert_close(fused(x[:tokens]), reference(x[:tokens]), rtol=1e-5,
                                       atol=1e-5)
    finally:
        _router_kernel.run = kernel  # type: ignore[method-assign]
    assert len(calls) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("residual", [True, False])
def test_the_norm_in_front_is_rms_norm_then_the_router(dtype: torch.dtype,
                                                       residual: bool) -> None:
    """The residual to rms_norm's bit, the normalised rows (the experts' input) within an ulp
    of it, the routing router_top_k's on them; a NaN row (graph padding) stays in its row."""
    x, w = _inputs(5, 24, 300, dtype, seed=7)
    gen = torch.Generator().manual_seed(8)
    res = torch.randn(5, 300, generator=gen).to(DEVICE, dtype) if residual else None
    norm_w = torch.randn(300, generator=gen).to(DEVICE, dtype)
    x[3] = float("nan")
    want_normed, want_res = rms_norm(x, norm_w, 1e-5, res)
    counts = counts_for(torch.device(DEVICE))
    want_w, want_i = router_top_k(want_normed, w, counts, 4, True)
    for _ in range(2):
        normed, new_res, weights, ids = norm_router_top_k(x, res, norm_w, 1e-5, w, counts, 4,
                                                          True)
        if residual:
            torch.testing.assert_close(new_res, want_res, rtol=0, atol=0, equal_nan=True)
        else:
            assert new_res is x
        real = torch.tensor([0, 1, 2, 4], device=DEVICE)
        torch.testing.assert_close(normed[real], want_normed[real], rtol=1e-2 if dtype ==
                                   torch.bfloat16 else 1e-6, atol=1e-6)
        assert normed[3].isnan().all() and ids[3].tolist() == [0, 1, 2, 3]
        assert torch.equal(ids[real], want_i[real])
        torch.testing.assert_close(weights[real], want_w[real], rtol=1e-2, atol=1e-3)
        assert not counts.any()
    assert not norm_router_applies(x, res, norm_w[:64], w)
    with pytest.raises(ValueError, match="norm_router_top_k"):
        norm_router_top_k(x, res, norm_w[:64], 1e-5, w, counts, 4, True)


def test_the_triton_ops_fuse_the_moe_layers_norm_where_the_router_takes_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """TritonOps.norm_moe: a few tokens through the norm-fused router, more through rms_norm
    then the block; both as rms_norm then a block without the fused router."""
    reference, fused = _blocks(seed=6)
    gen = torch.Generator().manual_seed(6)
    calls: list[int] = []
    real = fused._norm_route_and_run_experts
    monkeypatch.setattr(fused, "normed_experts", lambda x, *a: calls.append(x.shape[0])
                        or real(x, *a))
    ops = TritonOps()
    norm_w = torch.randn(48, generator=gen).to(DEVICE)
    for tokens in (3, MAX_TOKENS + 1):
        x, res = (torch.randn(tokens, 48, generator=gen).to(DEVICE) for _ in range(2))
        out, new_res = ops.norm_moe(x, res, norm_w, 1e-5, fused)
        normed, want_res = ops.rms_norm(x, norm_w, 1e-5, res)
        assert torch.equal(new_res, want_res)
        torch.testing.assert_close(out, reference(normed), rtol=1e-5, atol=1e-5)
        assert not reference.fuses_norm(x, res, norm_w)
    assert calls == [3]
