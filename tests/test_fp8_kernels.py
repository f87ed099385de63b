"""The FP8 kernels against their torch references on the CPU, through the Triton interpreter.

The interpreter loads and stores float8_e4m3fn tensors, so the kernels run on real FP8 data
here, with one exception: its float32 -> e4m3 conversion (triton 3.9) drops the carry when
rounding up crosses a power of two (126.0 becomes 64, not 128; the GPU's cvt instruction
rounds correctly). The quantization test therefore allows exactly that difference and no
other, and the GEMM tests take the kernel's own quantized activations as the reference's
input. tl.dot products are taken in float32 in the interpreter (kernels._launch.upcast_dots),
exact for e4m3 inputs, so the GEMMs differ from the reference only in the order of float32
sums: 1e-5 relative. Shapes cross every tile edge (M, N, K not
multiples of the tiles, K not a multiple of the 128-wide scale group).

On a machine with CUDA the interpreter is not forced and the same checks run on the GPU
(tests/gpu/test_fp8_gpu.py adds the cuBLASLt path)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from tests.kernel_device import kernel_device
from warmgate.server.config.fp8_config import FP8Config
from warmgate.server.kernels.fp8_block_gemm import (
    BlockGemmLaunch,
    _block_gemm_kernel,
    block_scaled_mm,
    fp8_block_linear,
    quantize_groups,
    quantize_groups_reference,
)
from warmgate.server.kernels.fused_moe import MoELaunch, fused_moe
from warmgate.server.runner.fp8_linear import (
    _scaled_mm_linear,
    dequantize,
    quantize,
)
from warmgate.server.runner.moe import route

DEVICE = kernel_device(_block_gemm_kernel)
BLOCK = FP8Config("block", fmt="fp8")
# Small tiles: several M, N and K tiles, four K tiles per 128-group.
SMALL = BlockGemmLaunch(block_m=16, block_n=32, block_k=32, num_warps=4, num_stages=1)


@pytest.mark.parametrize(("m", "k"), [(1, 200), (5, 128), (19, 300)])
def test_group_quantization_equals_the_reference(m: int, k: int) -> None:
    x = (torch.randn(m, k, generator=torch.Generator().manual_seed(m)) * 3).to(DEVICE)
    x[0, :7] = 0.0  # a zero group's scale stays positive
    q, s = quantize_groups(x)
    rq, rs = quantize_groups_reference(x)
    torch.testing.assert_close(s.cpu(), rs.cpu(), rtol=0, atol=0)
    got, want = q.float().cpu(), rq.float().cpu()
    if DEVICE == "cpu":  # the interpreter's conversion bug: 2^e read back as 2^(e-1), only
        bad = got != want
        assert torch.equal(got[bad] * 2, want[bad]), (got[bad], want[bad])
        assert torch.equal(torch.log2(want[bad].abs()).frac(), torch.zeros(int(bad.sum())))
        got = torch.where(bad, want, got)
    assert torch.equal(got, want)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (m, -(-k // 128))


@pytest.mark.parametrize(("m", "n", "k", "launch"), [
    (1, 136, 200, SMALL),  # decode: one row, a partial N block and K group
    (21, 256, 384, SMALL),  # several tiles everywhere
    (3, 130, 72, None),  # the table's launch, K shorter than one group
])
def test_block_gemm_equals_the_dequantized_reference(m: int, n: int, k: int,
                                                     launch: BlockGemmLaunch | None) -> None:
    gen = torch.Generator().manual_seed(n + k)
    x = torch.randn(m, k, generator=gen)
    w, scale = quantize(torch.randn(n, k, generator=gen) / k ** 0.5, BLOCK)
    assert scale.shape == (-(-n // 128), -(-k // 128))
    xq, xs = quantize_groups(x.to(DEVICE))
    x_deq = xq.float().cpu() * xs.cpu().repeat_interleave(128, dim=1)[:, :k]
    expected = x_deq @ dequantize(w, scale).T
    got = block_scaled_mm(xq, xs, w.to(DEVICE), scale.to(DEVICE), torch.float32, launch)
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-5)
    # The custom op (what the model calls on CUDA) is the same two kernels.
    torch.testing.assert_close(fp8_block_linear(x.to(DEVICE), w.to(DEVICE), scale.to(DEVICE))
                               .cpu(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("tokens", "experts", "top_k", "hidden", "inter", "launch"), [
    (1, 4, 2, 200, 128, None),  # decode through the table's launch; K not a group multiple
    (9, 3, 2, 136, 256, MoELaunch(16, 32, 32, 4, 1)),  # several N, K tiles per group
])
def test_block_scaled_fused_moe_equals_the_torch_reference(
        tokens: int, experts: int, top_k: int, hidden: int, inter: int,
        launch: MoELaunch | None) -> None:
    """The FP8 experts: the grouped GEMMs with block scales against the reference on the
    same quantized activations (each GEMM's input quantized per token and 128-group)."""
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, hidden, generator=gen)
    w13, s13 = quantize(torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden ** 0.5,
                        BLOCK)
    w2, s2 = quantize(torch.randn(experts, hidden, inter, generator=gen) / inter ** 0.5, BLOCK)
    weights, ids = route(torch.randn(tokens, experts, generator=gen), top_k, renormalize=True)
    d = [t.to(DEVICE) for t in (x, w13, w2, weights, ids, s13, s2)]
    got = fused_moe(*d[:5], launch, w13_scale=d[5], w2_scale=d[6]).cpu()
    # The reference: per (token, slot), the dequantized activations through the dequantized
    # expert, with the kernel's own quantization of each GEMM's input.
    xq, xs = quantize_groups(d[0])
    x_deq = (xq.float().cpu() * xs.cpu().repeat_interleave(128, dim=1)[:, :hidden])
    w13_deq, w2_deq = dequantize(w13, s13), dequantize(w2, s2)
    out = torch.zeros(tokens, hidden)
    for t in range(tokens):
        for slot in range(top_k):
            e = int(ids[t, slot])
            gate_up = x_deq[t] @ w13_deq[e].T
            act = torch.nn.functional.silu(gate_up[:inter]) * gate_up[inter:]
            aq, a_s = quantize_groups(act[None].to(DEVICE))
            act_deq = aq.float().cpu() * a_s.cpu().repeat_interleave(128, dim=1)[:, :inter]
            out[t] += float(weights[t, slot]) * (act_deq[0] @ w2_deq[e].T)
    torch.testing.assert_close(got, out, rtol=1e-4, atol=1e-5)


def _cpu_scaled_mm_takes_row_scales() -> bool:
    """torch 2.11's CPU torch._scaled_mm takes per-tensor scales only (an internal assert on
    row-wise ones, seen on the GPU machine's image); 2.13's takes both."""
    a = torch.ones(2, 16).to(torch.float8_e4m3fn)  # [M, K] and [N, K], M = N = 2
    try:
        torch._scaled_mm(a, a.t(), scale_a=torch.ones(2, 1), scale_b=torch.ones(1, 2),
                         out_dtype=torch.bfloat16)
    except RuntimeError:
        return False
    return True


@pytest.mark.skipif(not _cpu_scaled_mm_takes_row_scales(),
                    reason="this torch's CPU _scaled_mm takes per-tensor scales only "
                           "(tests/gpu/test_fp8_gpu.py runs the path on CUDA)")
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("scheme", ["tensor", "channel"])
def test_scaled_mm_path_equals_the_dequantized_reference(scheme: str, static: bool) -> None:
    """The call the model makes on CUDA (runner.fp8_linear._scaled_mm_linear: activations
    quantized per token, or with the static input scale, row-wise scales on both sides):
    torch._scaled_mm runs on the CPU too, so its arguments' layout is checked here; the
    device runs it in tests/gpu/test_fp8_gpu.py. bf16 output: 1e-2 relative."""
    gen = torch.Generator().manual_seed(7)
    w, s = quantize(torch.randn(96, 160, generator=gen) / 160 ** 0.5, FP8Config(scheme))
    x = torch.randn(11, 160, generator=gen).to(torch.bfloat16)
    input_scale = torch.tensor([float(x.float().abs().max()) / 448.0]) if static else None
    got = _scaled_mm_linear(x, w, s, input_scale)
    # Written out here rather than through quantize_rows, which the path itself calls.
    xs = (x.float().abs().amax(dim=-1, keepdim=True) / 448.0 if input_scale is None
          else input_scale.reshape(1, 1).expand(11, 1))
    xq = (x.float() / xs).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    want = (xq.float() * xs) @ dequantize(w, s).T
    assert got.dtype == torch.bfloat16 and got.shape == (11, 96)
    assert ((got.float() - want).norm() / want.norm()).item() < 1e-2
