"""The compile phase's shape sweeps (CUDA only in the plan) cover what a step can issue."""

from __future__ import annotations

import dataclasses

from tests.runner_helpers import make_runner
from warmgate.server.core.results import PhaseStatus
from warmgate.server.warmup.compile_phase import _runs_shape_sweeps, run_compile_warmup
from warmgate.server.warmup.gemm_shapes import gemm_plan, layer_weights, sweep_gemm_shapes
from warmgate.server.warmup.sampler_rows import VARIANTS, sweep_sampler_rows


def test_gemm_plan_has_each_projection_shape_once_and_the_head_up_to_logits_rows() -> None:
    runner = make_runner(num_spec=3, max_num_seqs=8, max_num_batched_tokens=128)
    layer = runner.model.layers[0]
    shapes = {tuple(w.shape) for w in layer_weights(runner.model)}
    assert shapes == {tuple(getattr(layer, n).shape)
                      for n in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")}
    plan = gemm_plan(runner)
    assert [m for _, m in plan] == [128] * len(shapes) + [8 * 4]  # head: 8 reqs x (1 + 3)
    assert sweep_gemm_shapes(runner) == 128 * len(shapes) + 32


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
