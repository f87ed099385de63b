"""The per-slot MoE path (kernels.moe_gemv) for forwards of a few tokens, on the CPU through
the Triton interpreter: it equals the torch reference (runner.moe.torch_moe) and the grouped
path for every token count of its bucket, top-1/2/8, widths that are multiples of 16 but not
powers of two, with routes that repeat experts across tokens; block-scaled FP8 experts with
the grouped path's quantization; padding tokens' NaN rows and NaN routes leave the real tokens'
rows bit for bit as an unpadded forward gives them; the path is picked by the token count.

On a machine with CUDA the interpreter is not forced and the same checks run on the GPU."""

from __future__ import annotations

import importlib

import pytest
import torch

pytest.importorskip("triton")

from tests.kernel_device import kernel_device
from warmgate.server.config.fp8_config import FP8Config
from warmgate.server.config.moe_kernel import (
    GEMV_MAX_TOKENS,
    ExpertShape,
    MoELaunch,
    bucket_of,
    grouped_launch,
    launch_for,
    table_launch,
)
from warmgate.server.kernels.fp8_block_gemm import quantize_groups
from warmgate.server.kernels.fused_moe import fused_moe
from warmgate.server.kernels.moe_gemv import _down_kernel, moe_gemv
from warmgate.server.kernels.moe_route import route_topk
from warmgate.server.runner.fp8_linear import dequantize, quantize
from warmgate.server.runner.moe import torch_moe
from warmgate.server.runner.moe_launches import MoELaunches

DEVICE = kernel_device(_down_kernel)
# Small tiles: several N tiles per expert, a partial last K tile (K = 80 or 112 over 32).
SMALL = MoELaunch(block_m=1, block_n=16, block_k=32, num_warps=4, num_stages=1)
GROUPED = MoELaunch(block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=1)


def _experts(num_experts: int, hidden: int, inter: int, seed: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    w13 = torch.randn(num_experts, 2 * inter, hidden, generator=gen) / hidden ** 0.5
    w2 = torch.randn(num_experts, hidden, inter, generator=gen) / inter ** 0.5
    return w13, w2


def _routes(tokens: int, num_experts: int, top_k: int, seed: int
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct experts per token out of few, so tokens share experts; weights that sum to 1."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:top_k]
                       for _ in range(tokens)])
    weights = torch.softmax(torch.randn(tokens, top_k, generator=gen), dim=-1)
    return weights, ids


@pytest.mark.parametrize(("top_k", "experts", "hidden", "inter"), [
    (1, 3, 48, 80),
    (2, 5, 112, 48),
    (8, 10, 48, 80),
])
# The kernels take any token count: 8 is past what the table sends them (GEMV_MAX_TOKENS),
# with experts read for several tokens.
@pytest.mark.parametrize("tokens", [1, 3, 8])
def test_the_per_slot_path_equals_the_reference_and_the_grouped_path(
        tokens: int, top_k: int, experts: int, hidden: int, inter: int) -> None:
    w13, w2 = _experts(experts, hidden, inter, seed=top_k)
    weights, ids = _routes(tokens, experts, top_k, seed=tokens)
    if tokens > 1:  # an expert read for more than one token
        assert len(set(ids.flatten().tolist())) < ids.numel()
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(7))
    d = [t.to(DEVICE) for t in (x, w13, w2, weights, ids)]
    want = torch_moe(*d)
    got = moe_gemv(d[0], d[1], d[2], d[3].reshape(-1).contiguous(), d[4], SMALL)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, fused_moe(*d, GROUPED), rtol=1e-5, atol=1e-5)


def test_bfloat16_rounds_where_the_grouped_path_does() -> None:
    """The activation is stored and each slot's weighted row rounded in bf16 before the slot
    sum, where the grouped path rounds them: the two differ only in the order of float32
    sums, which seldom moves a bf16 rounding (none in the interpreter; summing the slots
    unrounded changes about half the elements)."""
    w13, w2 = _experts(6, 48, 80, seed=1)
    weights, ids = _routes(5, 6, 2, seed=1)
    x = torch.randn(5, 48, generator=torch.Generator().manual_seed(2))
    d = [t.to(DEVICE) for t in (x.bfloat16(), w13.bfloat16(), w2.bfloat16(), weights, ids)]
    got = fused_moe(*d, SMALL)  # the per-slot path (the kernels take any token count)
    assert SMALL.per_slot and got.dtype == torch.bfloat16
    grouped = fused_moe(*d, GROUPED)
    assert (got != grouped).float().mean() <= 0.05
    torch.testing.assert_close(got.float(), grouped.float(), rtol=1.6e-2, atol=1e-2)
    # The reference rounds the gate/up product too (a bf16 F.linear): close, not equal.
    torch.testing.assert_close(got.float(), torch_moe(*d).float(), rtol=1.6e-2, atol=1e-2)


def _fp8_case(tokens: int, top_k: int, experts: int, hidden: int, inter: int
              ) -> list[torch.Tensor]:
    block = FP8Config("block", fmt="fp8")
    gen = torch.Generator().manual_seed(tokens + top_k)
    w13, s13 = quantize(torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden ** 0.5,
                        block)
    w2, s2 = quantize(torch.randn(experts, hidden, inter, generator=gen) / inter ** 0.5, block)
    weights, ids = _routes(tokens, experts, top_k, seed=tokens)
    x = torch.randn(tokens, hidden, generator=gen)
    return [t.to(DEVICE) for t in (x, w13, w2, weights, ids, s13, s2)]


def _deq(q: torch.Tensor, scale: torch.Tensor, width: int) -> torch.Tensor:
    return q.float().cpu() * scale.cpu().repeat_interleave(128, dim=1)[:, :width]


# The intermediate width is a whole number of 128-row blocks (config.fp8_config.check_fp8:
# gate and up rows then never share a block); the hidden one need not be.
@pytest.mark.parametrize(("tokens", "top_k", "experts", "hidden", "inter"), [
    (1, 8, 10, 144, 128),  # K past one 128-group with a partial one
    (4, 2, 3, 208, 384),  # several groups along I, the last hidden one partial
    (8, 1, 3, 144, 128),
])
def test_fp8_experts_take_the_grouped_paths_quantization(
        tokens: int, top_k: int, experts: int, hidden: int, inter: int) -> None:
    """Each GEMV's input quantized per token and 128-group in the kernel as quantize_groups
    does it: the reference runs the dequantized experts on quantize_groups' own values (the
    interpreter's e4m3 conversion is then the same on both sides)."""
    d = _fp8_case(tokens, top_k, experts, hidden, inter)
    x, w13, w2, weights, ids, s13, s2 = d
    got = moe_gemv(x, w13, w2, weights.reshape(-1).contiguous(), ids, SMALL, w13_scale=s13,
                   w2_scale=s2).cpu()
    x_deq = _deq(*quantize_groups(x), hidden)
    w13_deq, w2_deq = dequantize(w13.cpu(), s13.cpu()), dequantize(w2.cpu(), s2.cpu())
    want = torch.zeros(tokens, hidden)
    for t in range(tokens):
        for slot in range(top_k):
            e = int(ids[t, slot])
            gate_up = x_deq[t] @ w13_deq[e].T
            act = torch.nn.functional.silu(gate_up[:inter]) * gate_up[inter:]
            act_deq = _deq(*quantize_groups(act[None].to(DEVICE)), inter)[0]
            want[t] += float(weights[t, slot]) * (act_deq @ w2_deq[e].T)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    grouped = fused_moe(*d[:5], GROUPED, w13_scale=s13, w2_scale=s2).cpu()
    torch.testing.assert_close(got, grouped, rtol=1e-4, atol=1e-5)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's, on the interpreter's NaNs
@pytest.mark.parametrize("fp8", [False, True])
def test_padding_rows_of_nan_leave_the_real_tokens_rows_as_they_were(fp8: bool) -> None:
    """Tokens 1 and 3 are a captured graph's padding: NaN hidden rows and NaN logits (their
    routes: NaN weights on the lowest experts, kernels.moe_route), and one slot whose id is out
    of range. The real tokens' rows equal the unpadded forward's exactly; nothing raises."""
    tokens, experts, top_k, hidden, inter = 4, 5, 2, 144, 128
    if fp8:
        x, w13, w2, _, _, s13, s2 = _fp8_case(tokens, top_k, experts, hidden, inter)
        scales = {"w13_scale": s13, "w2_scale": s2}
    else:
        w13, w2 = (t.to(DEVICE) for t in _experts(experts, hidden, inter, seed=3))
        x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(3)).to(DEVICE)
        scales = {}
    logits = torch.randn(tokens, experts, generator=torch.Generator().manual_seed(4))
    pad = [1, 3]
    x[pad] = float("nan")
    logits[pad] = float("nan")
    weights, ids = route_topk(logits.to(DEVICE), top_k, True)
    assert weights[pad].isnan().all() and ids[pad].tolist() == [[0, 1]] * 2
    ids[3, 1] = experts + 1000  # what must never be read: clamped to the last expert
    real = [0, 2]
    got = moe_gemv(x, w13, w2, weights.reshape(-1).contiguous(), ids, SMALL, **scales)
    alone = moe_gemv(x[real], w13, w2, weights[real].reshape(-1).contiguous(), ids[real],
                     SMALL, **scales)
    assert not got[real].isnan().any()
    assert torch.equal(got[real], alone)
    assert got[pad].isnan().all()


def test_the_path_is_picked_by_the_token_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Up to GEMV_MAX_TOKENS the table's launch is per-slot and fused_moe aligns nothing;
    past it the grouped GEMMs run. MoELaunches (what the runner looks up per forward) agrees,
    its per-slot bucket being one bucket of its own."""
    kernel = importlib.import_module("warmgate.server.kernels.fused_moe")
    aligned: list[int] = []
    align = kernel.align_by_expert

    def recording_align(ids: torch.Tensor, num_experts: int, block_m: int
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        aligned.append(ids.shape[0])
        return align(ids, num_experts, block_m)

    monkeypatch.setattr(kernel, "align_by_expert", recording_align)
    w13, w2 = _experts(4, 48, 32, seed=5)
    shape = ExpertShape(num_experts=4, top_k=2, hidden_size=48, intermediate_size=32)
    launches = MoELaunches(shape)
    for tokens in (1, GEMV_MAX_TOKENS, GEMV_MAX_TOKENS + 1):
        small = tokens <= GEMV_MAX_TOKENS
        assert launch_for(tokens).per_slot is small
        assert launches.launch(tokens).per_slot is small
        assert (bucket_of(tokens) == GEMV_MAX_TOKENS) is small
        weights, ids = _routes(tokens, 4, 2, seed=tokens)
        x = torch.randn(tokens, 48, generator=torch.Generator().manual_seed(tokens))
        d = [t.to(DEVICE) for t in (x, w13, w2, weights, ids)]
        torch.testing.assert_close(fused_moe(*d, launches.launch(tokens)), torch_moe(*d),
                                   rtol=1e-5, atol=1e-5)
    assert aligned == [GEMV_MAX_TOKENS + 1]  # the grouped path's alone
    # What the per-slot bucket replaced (the bench's --grouped-moe forces it): grouped.
    forced = grouped_launch(GEMV_MAX_TOKENS, shape)
    assert not forced.per_slot and forced == table_launch(32, shape, GEMV_MAX_TOKENS)
