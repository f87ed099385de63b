"""The FP8 paths on the device, against their dequantized references: `torch._scaled_mm`
(per-tensor and per-channel weights, activations per token, dynamic or static), the Triton
block-scaled GEMM and its activation quantization, the block-scaled fused MoE; both linears
under torch.compile and in a CUDA graph; and small FP8 models through the whole warmup with
nothing compiled after ready.

Tolerances are relative Frobenius errors. Against the reference fed the same FP8 activations
the only differences are float32 summation order and the bf16 output (2^-9 relative per
element): 1e-2. Against unquantized activations e4m3's 3 mantissa bits (2^-4 relative per
element at worst, far less on average over a dot product) add theirs: 5e-2.
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)
if torch.cuda.get_device_capability() < (8, 9):
    pytest.skip("needs FP8 matmuls (compute capability 8.9 or newer)", allow_module_level=True)

pytest.importorskip("triton")

from tests.test_compile_warmup import run_random_batches
from warmgate.server.config.fp8_config import FP8Config
from warmgate.server.config.runner_config import (
    DeviceConfig,
    ModelConfig,
    RunnerConfig,
    SchedulerConfig,
)
from warmgate.server.jit import JitMonitor
from warmgate.server.kernels.fp8_block_gemm import (
    block_scaled_mm,
    fp8_block_linear,
    quantize_groups,
    quantize_groups_reference,
)
from warmgate.server.kernels.fused_moe import fused_moe
from warmgate.server.runner.fp8_linear import dequantize, fp8_linear, quantize, quantize_rows
from warmgate.server.runner.moe import route, torch_moe
from warmgate.server.warmup import load_runner, run_warmup_plan

DEV = "cuda"
BLOCK = FP8Config("block", fmt="fp8", ignore=())


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def _randn(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    gen = torch.Generator(device=DEV).manual_seed(seed)
    return torch.randn(*shape, device=DEV, generator=gen).to(dtype)


@pytest.mark.parametrize("m", [1, 7, 64, 300])
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("scheme", ["tensor", "channel"])
def test_scaled_mm_equals_the_dequantized_reference(scheme: str, static: bool, m: int) -> None:
    n, k = 6144, 4096  # Llama-3.1-8B's q/k/v
    w, s = quantize(_randn(n, k, seed=m) / k ** 0.5, FP8Config(scheme))
    x = _randn(m, k, seed=m + 1, dtype=torch.bfloat16)
    input_scale = (x.float().abs().amax() / 448.0).reshape(1) if static else None
    got = fp8_linear(x, w, s, input_scale)
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    xq, xs = quantize_rows(x, input_scale)
    assert rel(got, (xq.float() * xs) @ dequantize(w, s).T) < 1e-2
    assert rel(got, x.float() @ dequantize(w, s).T) < 5e-2


@pytest.mark.parametrize("m", [1, 16, 17, 100, 300, 2048])
@pytest.mark.parametrize(("n", "k"), [(5120, 2048), (2048, 4096), (1536, 2048), (2048, 768)])
def test_block_gemm_equals_the_dequantized_reference(m: int, n: int, k: int) -> None:
    """Qwen3-30B-A3B's attention and expert shapes, every launch of the token-count table."""
    w, s = quantize(_randn(n, k, seed=n) / k ** 0.5, BLOCK)
    x = _randn(m, k, seed=m, dtype=torch.bfloat16)
    xq, xs = quantize_groups(x)
    rq, rs = quantize_groups_reference(x)
    torch.testing.assert_close(xs, rs, rtol=1e-6, atol=0)
    # The device rounds like torch; a division a last bit apart may flip one value's rounding.
    assert (xq.float() != rq.float()).float().mean().item() < 1e-3
    want = (xq.float() * xs.repeat_interleave(128, dim=1)[:, :k]) @ dequantize(w, s).T
    got = block_scaled_mm(xq, xs, w, s, torch.bfloat16)
    assert got.dtype == torch.bfloat16 and rel(got, want) < 1e-2
    assert rel(fp8_block_linear(x, w, s), x.float() @ dequantize(w, s).T) < 5e-2


@pytest.mark.parametrize("tokens", [1, 8, 64, 300])
def test_block_scaled_fused_moe_equals_the_dequantized_reference(tokens: int) -> None:
    """Qwen3-30B-A3B's expert shapes (32 of its 128 experts), top-8."""
    e, h, inter, top_k = 32, 2048, 768, 8
    w13, s13 = quantize(_randn(e, 2 * inter, h, seed=1) / h ** 0.5, BLOCK)
    w2, s2 = quantize(_randn(e, h, inter, seed=2) / inter ** 0.5, BLOCK)
    x = _randn(tokens, h, seed=tokens, dtype=torch.bfloat16)
    weights, ids = route(_randn(tokens, e, seed=3), top_k, renormalize=True)
    got = fused_moe(x, w13, w2, weights, ids, w13_scale=s13, w2_scale=s2)
    want = torch_moe(x.float(), w13, w2, weights, ids, w13_scale=s13, w2_scale=s2)
    assert got.dtype == torch.bfloat16 and rel(got, want) < 5e-2


@pytest.mark.parametrize("scheme", ["tensor", "block"])
def test_fp8_linear_under_torch_compile_and_in_a_cuda_graph(scheme: str) -> None:
    fp8 = BLOCK if scheme == "block" else FP8Config(scheme)
    w, s = quantize(_randn(1024, 2048, seed=0) / 2048 ** 0.5, fp8)
    x = _randn(24, 2048, seed=1, dtype=torch.bfloat16)
    eager = fp8_linear(x, w, s)
    compiled = torch.compile(lambda t: fp8_linear(t, w, s), fullgraph=True)
    assert rel(compiled(x), eager) < 1e-2
    static = x.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # loads every kernel before the capture
        fp8_linear(static, w, s)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fp8_linear(static, w, s)
    new = _randn(24, 2048, seed=2, dtype=torch.bfloat16)
    static.copy_(new)
    graph.replay()
    torch.testing.assert_close(out, fp8_linear(new, w, s), rtol=0, atol=0)


SMALL = dict(vocab_size=512, hidden_size=256, num_layers=2, num_heads=2, num_kv_heads=1,
             head_dim=128, intermediate_size=512, max_model_len=256)
MODELS = {
    "llama per-tensor": ModelConfig(fp8=FP8Config("tensor"), **SMALL),  # type: ignore[arg-type]
    "llama block": ModelConfig(fp8=BLOCK, **SMALL),  # type: ignore[arg-type]
    "qwen3_moe block": ModelConfig(
        architecture="qwen3_moe", num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=256, norm_topk_prob=True, fp8=BLOCK,
        **SMALL),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("backend", ["triton", "flashinfer"])
@pytest.mark.parametrize("name", list(MODELS))
def test_fp8_models_compile_nothing_after_ready(name: str, backend: str) -> None:
    """The warmup (FP8 sweep, CUDA graphs) covers every FP8 kernel a random batch meets."""
    if backend == "flashinfer":
        pytest.importorskip("flashinfer")
    config = RunnerConfig(model=MODELS[name],
                          scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=128),
                          device=DeviceConfig(device="cuda", dtype="bfloat16",
                                              attention_backend=backend))
    with JitMonitor() as monitor:
        runner, load = load_runner(config, jit_monitor=monitor)
        layer = runner.model.layers[0]
        weight = layer.qkv_proj if layer.moe is None else layer.moe.w13
        assert weight.dtype == torch.float8_e4m3fn
        assert run_warmup_plan(runner, load_phase=load).succeeded
        monitor.mark_ready()
        run_random_batches(runner, monitor, 60)
        counts = monitor.snapshot()
        assert counts.total_after_ready == 0, counts
        assert counts.graph_misses_after_ready == 0, counts
