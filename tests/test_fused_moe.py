"""The fused MoE kernel (kernels.fused_moe) against the torch reference (runner.moe.torch_moe)
on the CPU through the Triton interpreter: float32, bit-close. Shapes are small but not powers
of two, so every tile edge (rows, N, K) and every expert's padding is crossed; launches from
the table and smaller ones that need several tiles per expert both run.

On a machine with CUDA the interpreter is not forced and the same checks run on the GPU."""

from __future__ import annotations

import importlib

import pytest
import torch

pytest.importorskip("triton")

from tests.kernel_device import kernel_device
from warmgate.server.config.runner_config import ModelConfig
from warmgate.server.kernels.fused_moe import (
    LAUNCH_TABLE,
    MoELaunch,
    _grouped_gemm_kernel,
    align_by_expert,
    fused_moe,
    launch_for,
    token_buckets,
)
from warmgate.server.kernels.moe_route import route_topk
from warmgate.server.runner.moe import MoEBlock, experts_for, route, routing_for, torch_moe

DEVICE = kernel_device(_grouped_gemm_kernel)
SMALL = MoELaunch(block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=1)


def _case(tokens: int, experts: int, top_k: int, hidden: int, inter: int, seed: int
          ) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden ** 0.5
    w2 = torch.randn(experts, hidden, inter, generator=gen) / inter ** 0.5
    router = torch.randn(experts, hidden, generator=gen)
    weights, ids = route(x @ router.T, top_k, renormalize=seed % 2 == 0)
    return tuple(t.to(DEVICE) for t in (x, w13, w2, weights, ids))


@pytest.mark.parametrize(("tokens", "experts", "top_k", "hidden", "inter", "launch"), [
    (1, 8, 2, 48, 40, None),  # decode: most experts get no row
    (7, 4, 2, 48, 40, SMALL),  # several N and K tiles per expert
    (37, 6, 3, 40, 24, SMALL),  # several M tiles for some experts, padding in each
    (40, 3, 1, 32, 20, None),  # top-1, the second bucket's launch
])
def test_fused_moe_equals_the_torch_reference(tokens: int, experts: int, top_k: int,
                                               hidden: int, inter: int,
                                               launch: MoELaunch | None) -> None:
    x, w13, w2, weights, ids = _case(tokens, experts, top_k, hidden, inter, tokens)
    want = torch_moe(x, w13, w2, weights, ids)
    got = fused_moe(x, w13, w2, weights, ids, launch)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_rows_sorted_and_padded_by_expert() -> None:
    ids = torch.tensor([[2, 0], [2, 1], [0, 2]], device=DEVICE)
    rows, tiles, used = align_by_expert(ids, num_experts=4, block_m=4)
    pad = ids.numel()
    # Flat rows token * k + slot. expert 0: rows 1, 4; expert 1: row 3; expert 2: rows 0,
    # 2, 5; expert 3: none. Each run padded to a tile of 4.
    assert int(used) == 12
    assert rows[:12].tolist() == [1, 4, pad, pad, 3, pad, pad, pad, 0, 2, 5, pad]
    assert tiles[:3].tolist() == [0, 1, 2]
    # The worst case (6 rows + 3 padding rows for each of 4 experts, in whole tiles) is
    # allocated whatever the routing: no shape depends on it, so no host sync either.
    assert rows.shape == (20,) and tiles.shape == (5,)
    assert rows[12:].tolist() == [pad] * 8


def test_launch_table_covers_every_token_count_in_order() -> None:
    bounds = token_buckets()
    assert list(bounds) == sorted(bounds) and len(bounds) == len(LAUNCH_TABLE)
    assert launch_for(1) == LAUNCH_TABLE[0][1]
    assert launch_for(bounds[0]) == LAUNCH_TABLE[0][1]
    assert launch_for(bounds[0] + 1) == LAUNCH_TABLE[1][1]
    assert launch_for(10**9) == LAUNCH_TABLE[-1][1]
    for _, launch in LAUNCH_TABLE:  # tl.dot needs tiles of at least 16 (the grouped GEMMs')
        assert launch.per_slot or min(launch.block_m, launch.block_n, launch.block_k) >= 16
    # The first bucket alone takes the per-slot kernels (kernels.moe_gemv).
    assert [launch.per_slot for _, launch in LAUNCH_TABLE] == [True] + [False] * (len(bounds) - 1)


def test_moe_block_runs_the_kernels_on_cuda_and_both_paths_agree() -> None:
    assert experts_for(torch.device("cuda")) is fused_moe
    assert experts_for(torch.device("cpu")) is torch_moe
    assert routing_for(torch.device("cuda")) is route_topk
    assert routing_for(torch.device("cpu")) is route
    config = ModelConfig(architecture="mixtral", hidden_size=48, num_experts=5,
                         num_experts_per_tok=2, moe_intermediate_size=40, norm_topk_prob=True)
    device = torch.device(DEVICE)
    reference = MoEBlock(config, device, torch.float32, experts=torch_moe)
    kernel = MoEBlock(config, device, torch.float32, experts=fused_moe, routing=route_topk)
    gen = torch.Generator().manual_seed(3)
    for a, b in zip(reference.parameters(), kernel.parameters(), strict=True):
        a.copy_(torch.randn(a.shape, generator=gen) / a.shape[-1] ** 0.5)
        b.copy_(a)
    x = torch.randn(21, 48, generator=gen).to(device)
    torch.testing.assert_close(kernel(x), reference(x), rtol=1e-5, atol=1e-5)


# What would sync with the host on CUDA (a value copied back to decide a shape or a branch):
# patched to raise while the kernel's host code runs, so a capture-breaking sync is caught
# on the CPU too. The interpreter itself reads its arguments through numpy, not these.
_SYNCS = ("item", "tolist", "nonzero", "__bool__", "__int__", "__float__")


@pytest.mark.parametrize("tokens", [1, 3, 16, 45])
def test_fused_moe_never_reads_a_device_value_and_pads_to_a_fixed_size(
        tokens: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # The package re-exports the function under the module's name: fetch the module itself.
    kernel = importlib.import_module("warmgate.server.kernels.fused_moe")
    x, w13, w2, weights, ids = _case(tokens, 6, 2, 32, 16, tokens)
    want = torch_moe(x, w13, w2, weights, ids)
    sizes: list[tuple[int, int]] = []
    align = kernel.align_by_expert

    def recording_align(ids: torch.Tensor, num_experts: int, block_m: int
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = align(ids, num_experts, block_m)
        sizes.append((out[0].numel(), block_m))
        return out

    monkeypatch.setattr(kernel, "align_by_expert", recording_align)

    def sync(*args: object, **kwargs: object) -> None:
        raise AssertionError("a host sync inside the MoE forward")

    with monkeypatch.context() as m:
        for name in _SYNCS:
            m.setattr(torch.Tensor, name, sync)
        for name in ("nonzero", "unique", "masked_select"):
            m.setattr(torch, name, sync)
        got = fused_moe(x, w13, w2, weights, ids, SMALL)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # The padded rows: the worst case for the token count, whatever the routing picked.
    (capacity, block_m), = sizes
    bound = tokens * 2 + 6 * (block_m - 1)
    assert bound <= capacity < bound + block_m and capacity % block_m == 0
