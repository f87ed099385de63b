"""The small-M dense kernel compiled for the GPU, and the warmup's choice between it and cuBLAS.

- At llama-3.2-1b / llama-3.1-8b projection shapes, every row count 1..16 equals F.linear in
  bf16 (within its rounding), with and without a bias.
- With SiLU-and-mul fused in, the unfused Triton kernels' bits at the down projections.
- One binary per (shape, row bucket): M 2..16 and a bias compile nothing more.
- A captured CUDA graph replays it on new inputs.
- A model warmed by the real plan has its choices timed before the graphs (the cuda_graphs
  phase reports them), and a workload after ready compiles nothing, misses no CUDA graph and
  meets no undecided (shape, M).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.gpu.test_backends_gpu import SHAPES
from tests.runner_helpers import prompt, tiny_config
from tests.serving_helpers import Served, greedy
from warmgate.server.jit import JitMonitor
from warmgate.server.kernels.activation import silu_and_mul
from warmgate.server.kernels.dense_gemv import _gemv_kernel, dense_gemv, silu_mul_gemv
from warmgate.server.kernels.linear_choices import LinearChoices
from warmgate.server.kernels.norm_gemv import norm_act_gemv, norm_gemv
from warmgate.server.warmup.plan import load_runner, run_warmup_plan

DEV = torch.device("cuda")
# (N, K): llama-3.2-1b's qkv, o, down; llama-3.1-8b's qkv, gate/up, down.
MODEL_SHAPES = [(3072, 2048), (2048, 2048), (2048, 8192), (6144, 4096), (28672, 4096),
                (4096, 14336)]


def _binaries() -> int:
    return len(_gemv_kernel.device_caches[DEV.index or 0][0])


@pytest.mark.parametrize(("n", "k"), MODEL_SHAPES)
def test_model_shapes_match_f_linear_at_every_row_count(n: int, k: int) -> None:
    gen = torch.Generator(device=DEV).manual_seed(n + k)
    w = torch.randn(n, k, device=DEV, generator=gen, dtype=torch.bfloat16) / k ** 0.5
    bias = torch.randn(n, device=DEV, generator=gen, dtype=torch.bfloat16)
    for m in range(1, 17):
        x = torch.randn(m, k, device=DEV, generator=gen, dtype=torch.bfloat16)
        for b in (None, bias):
            ref = F.linear(x.float(), w.float(), None if b is None else b.float())
            out = dense_gemv(x, w, b)
            err = ((out.float() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, (n, k, m, b is not None, err)


@pytest.mark.parametrize(("n", "k"), [(2048, 8192), (4096, 14336)])
def test_silu_mul_fused_is_the_unfused_gemv_to_the_bit(n: int, k: int) -> None:
    """llama-3.2-1b's and llama-3.1-8b's down projections: the activation computed in the
    kernel with silu_and_mul's operations and rounding."""
    gen = torch.Generator(device=DEV).manual_seed(n)
    w = torch.randn(n, k, device=DEV, generator=gen, dtype=torch.bfloat16) / k ** 0.5
    for m in (1, 3, 8, 16):
        gate_up = torch.randn(m, 2 * k, device=DEV, generator=gen, dtype=torch.bfloat16)
        act = silu_and_mul(gate_up)
        fused = silu_mul_gemv(gate_up, w)
        assert torch.equal(fused, dense_gemv(act, w)), (n, k, m)
        ref = F.linear(act.float(), w.float())
        assert ((fused.float() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.parametrize(("two_i", "k"), [(16384, 2048), (28672, 4096)])
def test_norm_and_act_fused_are_the_norm_gemv_then_silu_and_mul_to_the_bit(
        two_i: int, k: int) -> None:
    """llama-3.2-1b's and llama-3.1-8b's gate/up projections with their RMSNorm: half the
    program's weight rows gate rows and half up rows, each product rounded as norm_gemv
    stores it, then the activation as silu_and_mul computes it; the residual rms_norm's."""
    gen = torch.Generator(device=DEV).manual_seed(two_i)
    w = torch.randn(two_i, k, device=DEV, generator=gen, dtype=torch.bfloat16) / k ** 0.5
    norm_w = torch.randn(k, device=DEV, generator=gen, dtype=torch.bfloat16)
    for m in (1, 3, 8, 16):
        x, res = (torch.randn(m, k, device=DEV, generator=gen, dtype=torch.bfloat16)
                  for _ in range(2))
        act, new_res = norm_act_gemv(x, res, norm_w, 1e-5, w)
        gate_up, want_res = norm_gemv(x, res, norm_w, 1e-5, w)
        assert torch.equal(act, silu_and_mul(gate_up)), (two_i, k, m)
        assert torch.equal(new_res, want_res)


def test_one_binary_per_shape_and_row_bucket() -> None:
    n, k = 1040, 2064  # a shape no other test compiles
    w = torch.randn(n, k, device=DEV, dtype=torch.bfloat16)
    bias = torch.randn(n, device=DEV, dtype=torch.bfloat16)
    before = _binaries()
    dense_gemv(torch.randn(1, k, device=DEV, dtype=torch.bfloat16), w)
    dense_gemv(torch.randn(2, k, device=DEV, dtype=torch.bfloat16), w)
    assert _binaries() == before + 2
    for m in range(1, 17):
        dense_gemv(torch.randn(m, k, device=DEV, dtype=torch.bfloat16), w, bias)
    assert _binaries() == before + 2


def test_a_captured_graph_replays_it_on_new_inputs() -> None:
    n, k = 2048, 8192  # split along K: both kernels in the graph
    w = torch.randn(n, k, device=DEV, dtype=torch.bfloat16) / k ** 0.5
    x = torch.randn(4, k, device=DEV, dtype=torch.bfloat16)
    dense_gemv(x, w)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = dense_gemv(x, w)
    x.copy_(torch.randn(4, k, device=DEV, dtype=torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, dense_gemv(x, w))


@pytest.mark.parametrize("k", [0, 3])
def test_a_warmed_model_times_its_linears_and_serves_without_a_miss(k: int) -> None:
    config = tiny_config(device="cuda", dtype="bfloat16", attention_backend="triton",
                         num_spec=k, block_size=16, max_model_len=256, max_num_seqs=8,
                         max_num_batched_tokens=128, num_blocks=128, **SHAPES)
    monitor = JitMonitor()
    runner, load_phase = load_runner(config, jit_monitor=monitor)
    report = run_warmup_plan(runner, load_phase=load_phase)
    assert report.succeeded, report.to_dict()
    linears = report.phase("cuda_graphs").shapes["dense_linears"]
    assert linears["timed"] > 0
    monitor.mark_ready()
    choices = runner.model.ops.linear_choices  # type: ignore[attr-defined]
    assert isinstance(choices, LinearChoices) and choices.filled
    served = Served(runner)
    for i, n in enumerate((3, 9, 17, 40, 5, 70)):
        served.submit(f"r{i}", prompt(n, offset=i, vocab=1000), greedy(12))
    served.run()
    counts = monitor.snapshot()
    assert not any(counts.after_ready.values()), counts.after_ready
    assert counts.graph_misses_after_ready == 0
    assert choices.misses == 0
