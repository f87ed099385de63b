"""The compile phase's shape sweeps (CUDA only in the plan) cover what a step can issue: the
dense GEMMs at every token count a forward can run outside a CUDA graph (cuBLAS chooses an
algorithm per new shape), the sampler at every batch size."""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import pytest
import torch

from tests.runner_helpers import make_runner
from warmgate.server.core.results import PhaseStatus
from warmgate.server.runner.eager_tokens import EAGER_TOKEN_GRANULE
from warmgate.server.warmup import gemm_shapes
from warmgate.server.warmup.compile_phase import _runs_shape_sweeps, run_compile_warmup
from warmgate.server.warmup.gemm_shapes import gemm_plan, layer_weights, sweep_gemm_shapes
from warmgate.server.warmup.sampler_rows import VARIANTS, sweep_sampler_rows


@pytest.fixture
def linear_ms(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The M of every GEMM the sweep runs itself."""
    seen: list[int] = []
    real = gemm_shapes.F.linear

    def counting(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        seen.append(x.shape[0])
        return real(x, w)

    monkeypatch.setattr(gemm_shapes.F, "linear", counting)
    return seen


def test_gemm_plan_has_each_projection_shape_once_and_the_head_up_to_logits_rows(
        linear_ms: list[int]) -> None:
    runner = make_runner(num_spec=3, max_num_seqs=8, max_num_batched_tokens=128)
    layer = runner.model.layers[0]
    shapes = {tuple(w.shape) for w in layer_weights(runner.model)}
    assert shapes == {tuple(getattr(layer, n).shape)
                      for n in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")}
    plan = gemm_plan(runner)
    # On the CPU no graph is captured: the layers at every count; the head: 8 reqs x (1 + 3).
    assert [ms for _, ms in plan] == [list(range(1, 129))] * len(shapes) + [
        list(range(1, 33))]
    assert sweep_gemm_shapes(runner) == 128 * len(shapes) + 32
    assert linear_ms == [*list(range(1, 129)) * len(shapes), *range(1, 33)]


def _on_cuda(runner: Any) -> Any:
    """The runner as it is built on CUDA (graphs get captured, eager batches pad to the
    granule): only the device and the granule differ."""
    runner.device = torch.device("cuda")
    runner.eager_granule = EAGER_TOKEN_GRANULE
    return runner


GRANULES = list(range(EAGER_TOKEN_GRANULE, 129, EAGER_TOKEN_GRANULE))  # of a 128 budget


def test_with_ragged_graphs_only_uniform_decodes_past_the_largest_graph_run_eagerly(
        linear_ms: list[int]) -> None:
    runner = _on_cuda(make_runner(attention_backend="triton", max_num_seqs=8))
    assert runner.config.compilation.cuda_graph_sizes == (1, 2, 4, 8)
    assert runner.eager_token_counts() == []  # ragged graphs up to the budget, decode to 8
    assert [len(ms) for _, ms in gemm_plan(runner)] == [8]  # the head alone
    assert sweep_gemm_shapes(runner) == 8 and linear_ms == list(range(1, 9))
    # Graphs for up to 8 requests of 12 (the default sizes would reach 12): 9..12 x (1 + 3).
    wider = _on_cuda(make_runner(attention_backend="triton", max_num_seqs=12, num_spec=3))
    wider.config = dataclasses.replace(wider.config, compilation=dataclasses.replace(
        wider.config.compilation, cuda_graph_sizes=(1, 2, 4, 8)))
    assert wider.eager_token_counts() == [4 * n for n in range(9, 13)]


def test_without_graphs_for_every_batch_eager_batches_run_at_the_granules() -> None:
    # The torch backend captures no ragged graphs: other batches at the granules; decodes fit.
    assert _on_cuda(make_runner()).eager_token_counts() == GRANULES
    runner = _on_cuda(make_runner(attention_backend="triton"))
    base = runner.config
    decodes = list(range(1, 9))  # 1..8 requests of 1 token
    for off, counts in (({"enable_cuda_graphs": False}, sorted({*decodes, *GRANULES})),
                        ({"ragged_cuda_graphs": False}, GRANULES),
                        ({"cuda_graph_sizes": ()}, sorted({*decodes, *GRANULES}))):
        runner.config = dataclasses.replace(base, compilation=dataclasses.replace(
            base.compilation, **off))
        assert runner.eager_token_counts() == counts, off
    pooling = _on_cuda(make_runner(attention_backend="triton", pooling=True))
    assert pooling.eager_token_counts() == sorted({*decodes, *GRANULES})
    assert [len(ms) for _, ms in gemm_plan(pooling)] == [len(decodes) + len(GRANULES)] * 4


def test_on_the_cpu_nothing_pads_and_every_count_runs() -> None:
    runner = make_runner(attention_backend="triton")
    assert runner.eager_granule == 1 and runner.eager_tokens(5) == 5
    assert runner.eager_token_counts() == list(range(1, 129))


def test_eager_tokens_round_up_to_the_granule_within_the_budget() -> None:
    runner = _on_cuda(make_runner(max_num_batched_tokens=120))
    assert [runner.eager_tokens(n) for n in (1, 16, 17, 112, 113, 120)] == [
        16, 16, 32, 112, 120, 120]


def test_with_torch_compile_every_forward_pads_to_a_bucket() -> None:
    runner = _on_cuda(make_runner(attention_backend="triton"))
    runner.compile_buckets = (4, 8, 64, 128)
    assert runner.eager_token_counts() == [4, 8, 64, 128]


def test_a_gemm_sweep_holds_its_input_only_while_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan's sweeps are built at once; each allocates its input at its first call and
    drops it at its last (max M), so only one is alive at a time."""
    made: list[weakref.ref[torch.Tensor]] = []
    real_zeros = torch.zeros

    def zeros(*args: object, **kwargs: object) -> torch.Tensor:
        t = real_zeros(*args, **kwargs)
        made.append(weakref.ref(t))
        return t

    monkeypatch.setattr(gemm_shapes.torch, "zeros", zeros)
    weight = torch.randn(6, 4)
    sweep = gemm_shapes.gemm_sweep(weight, 3)
    assert not made  # building the sweep allocates nothing
    sweep.call(1)
    sweep.call(2)
    assert len(made) == 1 and made[0]() is not None
    sweep.call(3)
    assert made[0]() is None  # released at max M
    sweep.call(1)  # a second run allocates again
    assert len(made) == 2


def test_sampler_sweep_runs_sample_and_verify_for_every_batch_size() -> None:
    plain, spec = make_runner(max_num_seqs=4), make_runner(num_spec=2, max_num_seqs=4)
    # Then the logprobs gather at every logits row count, with and without top-n.
    assert sweep_sampler_rows(plain) == len(VARIANTS) * 4 + 4 * 2
    assert sweep_sampler_rows(spec) == len(VARIANTS) * 4 * 2 + 4 * 3 * 2


def test_the_compile_phase_sweeps_only_on_cuda_and_only_when_enabled() -> None:
    runner = make_runner()
    assert not _runs_shape_sweeps(runner)  # CPU: cuBLAS is not involved
    result = run_compile_warmup(runner, runner.execute_model, runner.sample_tokens)
    assert result.phases[0].status is PhaseStatus.SKIPPED
    off = dataclasses.replace(runner.config, compilation=dataclasses.replace(
        runner.config.compilation, shape_sweeps=False))
    assert off.config_hash() != runner.config.config_hash()


def test_a_moe_layers_sweep_has_its_router_and_no_dense_mlp() -> None:
    """The router is a cuBLAS GEMM at every token count; the experts are the fused kernel."""
    from warmgate.server.config.runner_config import ModelConfig
    from warmgate.server.runner.model import LlamaModel
    from warmgate.server.runner.ops import TorchOps

    config = ModelConfig(architecture="qwen3_moe", num_experts=6, num_experts_per_tok=2,
                         moe_intermediate_size=24)
    model = LlamaModel(config, TorchOps(), None, torch.device("cpu"), torch.float32)
    layer = model.layers[0]
    assert layer.moe is not None and layer.gate_up_proj is None
    assert {tuple(w.shape) for w in layer_weights(model)} == {
        tuple(layer.qkv_proj.shape), tuple(layer.o_proj.shape), (6, config.hidden_size)}
