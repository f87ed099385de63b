"""FP8 models in the warmup: the dense GEMM sweep leaves FP8 projections to their own sweep
(warmup/fp8_gemms.py; F.linear cannot take an FP8 weight), which lists one projection per
shape; and an FP8 model under torch.compile warms every bucket and compiles nothing after
ready, with the same logits as eager (on the CPU, where the projections dequantize)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.test_compile_warmup import (
    assert_compiled_matches_eager,
    compiled_config,
    run_random_batches,
    three_buckets,
)
from warmgate.server.config.fp8_config import FP8Config
from warmgate.server.config.runner_config import (
    ModelConfig,
    RunnerConfig,
    SchedulerConfig,
    resolve_runner_config,
)
from warmgate.server.jit import JitMonitor
from warmgate.server.runner.model import LlamaModel
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.runner.ops import TorchOps
from warmgate.server.warmup import load_runner, run_warmup_plan
from warmgate.server.warmup.fp8_gemms import fp8_projections, sweep_fp8_gemms
from warmgate.server.warmup.gemm_shapes import layer_weights


def _meta(preset: str) -> LlamaModel:
    return LlamaModel(ModelConfig.from_preset(preset), TorchOps(), None, torch.device("meta"),
                      torch.bfloat16)


def test_fp8_projections_get_their_own_sweep() -> None:
    dense, moe = _meta("llama-3.1-8b-fp8"), _meta("qwen3-30b-a3b-fp8")
    # Every Llama projection is FP8: nothing left for F.linear's sweep (the head is swept by
    # gemm_plan apart); the MoE model keeps its bf16 router there.
    assert layer_weights(dense) == []
    assert [tuple(w.shape) for w in layer_weights(moe)] == [(128, 2048)]
    shapes = {(tuple(w.shape), tuple(s.shape)) for w, s, _ in fp8_projections(dense)}
    assert shapes == {((6144, 4096), (6144,)), ((4096, 4096), (4096,)),
                      ((28672, 4096), (28672,)), ((4096, 14336), (4096,))}
    shapes = {(tuple(w.shape), tuple(s.shape)) for w, s, _ in fp8_projections(moe)}
    assert shapes == {((5120, 2048), (40, 16)), ((2048, 4096), (16, 32))}


def test_the_fp8_sweep_runs_on_cuda_only() -> None:
    """The CPU dequantizes: no per-shape state to warm, so no calls."""
    model = LlamaModel(ModelConfig(fp8=FP8Config()), TorchOps(), None, torch.device("cpu"),
                       torch.float32)
    runner = SimpleNamespace(model=model, device=torch.device("cpu"),
                             eager_token_counts=lambda: [1, 2, 3])
    assert sweep_fp8_gemms(runner) == 0  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.parametrize("fp8", [FP8Config("tensor"), FP8Config("channel", static_input=True)])
def test_a_compiled_fp8_model_compiles_nothing_after_ready(fp8: FP8Config) -> None:
    eager = ModelRunner(resolve_runner_config(
        three_buckets(compiled_config(compile=False, fp8=fp8))))
    with JitMonitor() as monitor:
        compiled, load = load_runner(three_buckets(compiled_config(fp8=fp8)),
                                     jit_monitor=monitor)
        assert compiled.model.layers[0].qkv_proj.dtype == torch.float8_e4m3fn
        assert run_warmup_plan(compiled, load_phase=load).succeeded
        assert compiled.compile_buckets == (1, 8, 16)
        monitor.mark_ready()
        assert_compiled_matches_eager(compiled, eager)
        run_random_batches(compiled, monitor, 30)
        assert monitor.snapshot().total_after_ready == 0


@pytest.mark.slow
def test_an_fp8_moe_model_warms_and_serves_random_batches() -> None:
    """Block-scaled FP8 experts through the whole warmup plan (the moe phase included) and
    random batches after ready, on the CPU's torch paths."""
    model = ModelConfig(architecture="qwen3_moe", vocab_size=256, hidden_size=128, num_layers=2,
                        num_heads=2, num_kv_heads=1, head_dim=128, intermediate_size=128,
                        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128,
                        norm_topk_prob=True, max_model_len=128,
                        fp8=FP8Config("block", fmt="fp8", ignore=()))
    config = RunnerConfig(model=model,
                          scheduler=SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=16))
    with JitMonitor() as monitor:
        runner, load = load_runner(config, jit_monitor=monitor)
        moe = runner.model.layers[0].moe
        assert moe is not None and moe.w13.dtype == torch.float8_e4m3fn
        assert run_warmup_plan(runner, load_phase=load).succeeded
        monitor.mark_ready()
        run_random_batches(runner, monitor, 20)
        assert monitor.snapshot().total_after_ready == 0
