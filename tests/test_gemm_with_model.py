"""A start-up's dense-GEMM sweep begins as soon as the model's tensors exist, before the
weights are read into them, and the plan's compile phase takes that sweep over instead of
starting another: each GEMM runs once, on the sweep's thread. A load that fails after it
started waits for it; a sweep nobody takes over holds neither the runner nor its weights."""

from __future__ import annotations

import dataclasses
import gc
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.runner_helpers import make_runner, tiny_config
from tests.test_shape_sweep_kernel_map import fake_probe
from warmgate.server.cache import shape_sweeps
from warmgate.server.core.phases import COMPILE, CUDA_GRAPHS
from warmgate.server.core.results import PhaseResult, PhaseStatus, WarmupResult
from warmgate.server.runner import loading, model_runner
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.warmup import compile_phase, gemm_background, gemm_shapes, plan, size_sweeps

SWEEP = "warmgate-gemm-sweep"


@pytest.fixture
def sweep_gemms(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records every F.linear made on the sweep's thread (the model's own run elsewhere)."""
    seen: list[str] = []
    real = gemm_shapes.F.linear

    def linear(*args: Any) -> torch.Tensor:
        if threading.current_thread().name == SWEEP:
            seen.append("gemm")
        return real(*args)

    monkeypatch.setattr(gemm_shapes.F, "linear", linear)
    return seen


def _planned(runner: Any) -> int:
    return sum(len(ms) for _, ms in gemm_shapes.gemm_plan(runner))


def _no_sweep_thread() -> bool:
    return not any(t.name == SWEEP for t in threading.enumerate())


def test_on_model_built_comes_before_the_weights_with_the_token_counts_known(
        monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[str] = []
    real = loading.init_random_weights

    def weights(*args: Any) -> None:
        order.append("weights")
        real(*args)

    def built(runner: ModelRunner) -> None:
        order.append("built")
        assert runner.model is not None and runner.eager_token_counts()
        assert gemm_shapes.gemm_plan(runner)  # what start_with_model computes there

    monkeypatch.setattr(loading, "init_random_weights", weights)
    ModelRunner(tiny_config(), on_model_built=built)
    assert order == ["built", "weights"]


def test_only_a_one_gpu_cuda_start_without_torch_compile_starts_it_with_the_model() -> None:
    cuda = tiny_config(device="cuda", attention_backend="triton")
    cfg = cuda.compilation
    assert gemm_background.starts_with_model(cuda)
    assert not gemm_background.starts_with_model(tiny_config())  # the CPU has no sweep
    assert not gemm_background.starts_with_model(dataclasses.replace(
        cuda, compilation=dataclasses.replace(cfg, shape_sweeps=False)))
    assert not gemm_background.starts_with_model(dataclasses.replace(
        cuda, compilation=dataclasses.replace(cfg, compile=True)))
    assert not gemm_background.starts_with_model(dataclasses.replace(
        cuda, parallel=dataclasses.replace(cuda.parallel, tensor_parallel_size=2)))


def _starting_with_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """load_runner on the CPU as on one CUDA GPU, and the compile phase's sweep as there."""
    monkeypatch.setattr(plan, "starts_with_model", lambda config: True)

    def compile_warmup(model_runner: Any, *args: Any, defer_gemms_to: Any = None,
                       **kwargs: Any) -> WarmupResult:
        compile_phase._sweep(model_runner, defer_to=defer_gemms_to)
        return WarmupResult(ran=True, phases=[PhaseResult(COMPILE, PhaseStatus.RAN)])

    monkeypatch.setattr(plan, "run_compile_warmup", compile_warmup)
    monkeypatch.setattr(shape_sweeps, "kernel_map_dir", lambda: None)  # nothing to learn


def test_the_plan_takes_over_the_sweep_started_with_the_model(
        monkeypatch: pytest.MonkeyPatch, sweep_gemms: list[str]) -> None:
    _starting_with_the_model(monkeypatch)
    started: list[Any] = []
    real = gemm_background.GemmSweepThread.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        started.append(kwargs.get("where"))
        real(self, *args, **kwargs)

    monkeypatch.setattr(gemm_background.GemmSweepThread, "__init__", init)
    runner, _ = plan.load_runner(tiny_config())
    assert started == [gemm_background.WITH_THE_MODEL]
    report = plan.run_warmup_plan(runner)
    assert report.succeeded
    assert started == [gemm_background.WITH_THE_MODEL]  # the compile phase started none
    assert len(sweep_gemms) == _planned(runner)  # each GEMM once
    graphs = next(p for p in report.phases if p.name == CUDA_GRAPHS)
    assert graphs.shapes["waited_for_gemm_sweep_s"] >= 0  # waited for before the graphs
    assert gemm_background.take_started(runner) == [] and _no_sweep_thread()


def test_a_load_that_fails_after_the_sweep_started_waits_for_it(
        monkeypatch: pytest.MonkeyPatch, sweep_gemms: list[str]) -> None:
    _starting_with_the_model(monkeypatch)
    real = gemm_shapes.F.linear

    def slow(*args: Any) -> torch.Tensor:
        if threading.current_thread().name == SWEEP:
            time.sleep(0.002)
        return real(*args)

    def no_room(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError("the KV cache did not fit")

    monkeypatch.setattr(gemm_shapes.F, "linear", slow)
    monkeypatch.setattr(model_runner, "allocate_kv", no_room)
    with pytest.raises(MemoryError):
        plan.load_runner(tiny_config())
    assert _no_sweep_thread()
    assert sweep_gemms  # it had started, and ran to its end before the load returned


def test_while_the_sampler_map_is_learned_the_started_sweep_ends_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kinds: list[str] = []
    real = gemm_shapes.F.linear

    def linear(*args: Any) -> torch.Tensor:
        if threading.current_thread().name == SWEEP:
            time.sleep(0.001)  # slow enough that the sampler would overtake a running sweep
            kinds.append("gemm")
        return real(*args)

    runner = make_runner(max_num_seqs=4, max_num_batched_tokens=32)
    sample = runner.sampler.sample

    def sampled(*args: Any, **kwargs: Any) -> Any:
        kinds.append("sampler")
        return sample(*args, **kwargs)

    monkeypatch.setattr(gemm_shapes.F, "linear", linear)
    monkeypatch.setattr(runner.sampler, "sample", sampled)
    monkeypatch.setattr(shape_sweeps, "kernel_map_dir", lambda: tmp_path)
    monkeypatch.setattr(size_sweeps, "profile_sweep", fake_probe([]))
    pending = [gemm_background.start_with_model(runner)]
    gemm_background.take_started(runner)
    compile_phase._sweep(runner, defer_to=pending)
    assert pending == []  # ended within the phase
    assert kinds.count("gemm") == _planned(runner)
    assert kinds == sorted(kinds)  # every "gemm" before the first "sampler"


def test_a_sweep_nobody_takes_over_lets_the_runner_go() -> None:
    runner = make_runner(max_num_seqs=4, max_num_batched_tokens=32)
    thread = gemm_background.start_with_model(runner)
    thread.wait()
    assert id(runner) in gemm_background._started
    del runner
    gc.collect()
    assert not gemm_background._started  # its finalizer dropped the entry
    assert thread.result() > 0
