"""The compile phase's GEMM sweep runs on a thread of its own beside the sampler rows, with
the same calls and count as on the phase's thread; but on the phase's thread, before the
sampler rows, while those learn their kernel map (the probe sees every kernel of the
process); an error on either side is the phase's, with the thread ended first. In the plan
the thread outlives the phase: the plan waits for it before the CUDA graphs (its failure
fails them, and the plan) and, whatever happened, before it returns."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.runner_helpers import make_runner
from tests.test_shape_sweep_kernel_map import fake_probe
from warmgate.server.cache import shape_sweeps
from warmgate.server.core.phases import COMPILE, CUDA_GRAPHS, MIXED, PREFILL
from warmgate.server.core.results import PhaseResult, PhaseStatus, WarmupResult
from warmgate.server.warmup import compile_phase, gemm_shapes, plan, size_sweeps
from warmgate.server.warmup.gemm_background import finish_gemm_sweeps
from warmgate.server.warmup.sampler_rows import sweep_sampler_rows

# (thread name, what ran): "gemm" for the sweep's F.linear, "sampler" for sample().
Calls = list[tuple[str, str]]
SWEEP = "warmgate-gemm-sweep"  # the sweep thread's name


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    seen: Calls = []
    real = gemm_shapes.F.linear

    def linear(x: torch.Tensor, *rest: Any) -> torch.Tensor:
        seen.append((threading.current_thread().name, "gemm"))
        return real(x, *rest)

    monkeypatch.setattr(gemm_shapes.F, "linear", linear)
    return seen


def _runner(monkeypatch: pytest.MonkeyPatch, calls: Calls, kernel_dir: Path | None) -> Any:
    runner = make_runner(max_num_seqs=4, max_num_batched_tokens=32)
    real = runner.sampler.sample

    def sample(*args: Any, **kwargs: Any) -> Any:
        calls.append((threading.current_thread().name, "sampler"))
        return real(*args, **kwargs)

    monkeypatch.setattr(runner.sampler, "sample", sample)
    monkeypatch.setattr(shape_sweeps, "kernel_map_dir", lambda: kernel_dir)
    return runner


def _expected(runner: Any, kernel_dir: Path | None) -> int:
    gemms = sum(len(ms) for _, ms in gemm_shapes.gemm_plan(runner))
    return gemms + sweep_sampler_rows(runner, kernel_dir=kernel_dir)


def test_with_a_kept_map_the_gemms_run_on_their_own_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, calls: Calls) -> None:
    runner = _runner(monkeypatch, calls, tmp_path)
    sweep_sampler_rows(runner, kernel_dir=tmp_path, probe=fake_probe([]))  # learn the map
    expected = _expected(runner, tmp_path)
    calls.clear()
    assert compile_phase._sweep(runner) == expected
    gemm_threads = {name for name, what in calls if what == "gemm"}
    sampler_threads = {name for name, what in calls if what == "sampler"}
    assert gemm_threads == {"warmgate-gemm-sweep"}
    assert sampler_threads == {threading.current_thread().name}
    assert not any(t.name == "warmgate-gemm-sweep" for t in threading.enumerate())


def test_without_a_compile_cache_nothing_is_learned_and_the_gemms_run_beside(
        monkeypatch: pytest.MonkeyPatch, calls: Calls) -> None:
    runner = _runner(monkeypatch, calls, None)
    expected = _expected(runner, None)
    calls.clear()
    assert compile_phase._sweep(runner) == expected
    assert {name for name, what in calls if what == "gemm"} == {"warmgate-gemm-sweep"}


def test_while_the_sampler_map_is_learned_the_gemms_run_first_on_this_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, calls: Calls) -> None:
    runner = _runner(monkeypatch, calls, tmp_path)
    monkeypatch.setattr(size_sweeps, "profile_sweep", fake_probe([]))
    compile_phase._sweep(runner)
    me = threading.current_thread().name
    assert {name for name, _ in calls} == {me}
    kinds = [what for _, what in calls]
    assert kinds == sorted(kinds)  # every "gemm" before the first "sampler"
    calls.clear()
    compile_phase._sweep(runner)  # learned: the next start overlaps them
    assert {name for name, what in calls if what == "gemm"} == {"warmgate-gemm-sweep"}


def test_an_error_on_the_gemm_thread_is_the_phases(
        monkeypatch: pytest.MonkeyPatch, calls: Calls) -> None:
    runner = _runner(monkeypatch, calls, None)

    def broken(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(gemm_shapes.F, "linear", broken)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        compile_phase._sweep(runner)
    assert any(what == "sampler" for _, what in calls)  # the sampler rows ran beside it


def test_an_error_on_the_phases_thread_waits_for_the_gemms_first(
        monkeypatch: pytest.MonkeyPatch, calls: Calls) -> None:
    runner = _runner(monkeypatch, calls, None)
    started, release = threading.Event(), threading.Event()
    real = gemm_shapes.F.linear

    def slow(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        started.set()
        if not release.wait(10):  # once: a broken run fails, it does not hang
            release.set()
        return real(x, w)

    def failing(*args: Any, **kwargs: Any) -> Any:
        assert started.wait(10)
        threading.Timer(0.2, release.set).start()
        raise ValueError("stop")

    monkeypatch.setattr(gemm_shapes.F, "linear", slow)
    monkeypatch.setattr(runner.sampler, "sample", failing)
    with pytest.raises(ValueError, match="stop"):
        compile_phase._sweep(runner)
    assert release.is_set()  # _sweep returned only after the GEMM thread could finish
    assert not any(t.name == "warmgate-gemm-sweep" for t in threading.enumerate())


def test_deferred_the_sweep_outlives_the_phase_and_finish_waits_for_it(
        monkeypatch: pytest.MonkeyPatch, calls: Calls) -> None:
    runner = _runner(monkeypatch, calls, None)
    expected = _expected(runner, None)
    release = threading.Event()
    real = gemm_shapes.F.linear

    def held(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if not release.wait(10):  # once: a broken run fails, it does not hang
            release.set()
        return real(x, w)

    monkeypatch.setattr(gemm_shapes.F, "linear", held)
    pending: list[Any] = []
    assert compile_phase._sweep(runner, defer_to=pending) == expected  # counted, not run
    assert len(pending) == 1 and any(t.name == "warmgate-gemm-sweep"
                                     for t in threading.enumerate())
    release.set()
    assert finish_gemm_sweeps(pending) is not None
    assert finish_gemm_sweeps(pending) is None  # nothing left to wait for
    assert pending == [] and not any(t.name == "warmgate-gemm-sweep"
                                     for t in threading.enumerate())


def _plan_with_a_deferred_sweep(monkeypatch: pytest.MonkeyPatch, runner: Any) -> None:
    """The plan's compile phase on the CPU runner as on CUDA: the sampler rows here, the
    GEMMs left running on their thread."""
    def compile_warmup(model_runner: Any, *args: Any, defer_gemms_to: Any = None,
                       **kwargs: Any) -> WarmupResult:
        compile_phase._sweep(model_runner, defer_to=defer_gemms_to)
        return WarmupResult(ran=True, phases=[PhaseResult(COMPILE, PhaseStatus.RAN)])

    monkeypatch.setattr(plan, "run_compile_warmup", compile_warmup)


def test_a_failed_deferred_sweep_fails_the_plan_before_the_cuda_graphs(
        monkeypatch: pytest.MonkeyPatch, calls: Calls) -> None:
    runner = _runner(monkeypatch, calls, None)
    _plan_with_a_deferred_sweep(monkeypatch, runner)

    real = gemm_shapes.F.linear  # torch's, which the model calls too

    def broken(*args: Any) -> torch.Tensor:
        if threading.current_thread().name == SWEEP:
            raise RuntimeError("cuBLAS found no algorithm")
        return real(*args)

    monkeypatch.setattr(gemm_shapes.F, "linear", broken)
    report = plan.run_warmup_plan(runner)
    status = {p.name: p.status for p in report.phases}
    assert status[COMPILE] is status[PREFILL] is status[MIXED] is PhaseStatus.RAN
    graphs = next(p for p in report.phases if p.name == CUDA_GRAPHS)
    assert graphs.status is PhaseStatus.FAILED and "no algorithm" in graphs.detail
    assert not report.succeeded


def test_a_plan_that_fails_before_the_cuda_graphs_still_waits_for_the_sweep(
        monkeypatch: pytest.MonkeyPatch, calls: Calls) -> None:
    runner = _runner(monkeypatch, calls, None)
    _plan_with_a_deferred_sweep(monkeypatch, runner)
    real = gemm_shapes.F.linear
    done: list[bool] = []

    def slow(*args: Any) -> torch.Tensor:
        if threading.current_thread().name != SWEEP:
            return real(*args)
        time.sleep(0.001)
        out = real(*args)
        done.append(True)
        return out

    def kernels_fail(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("kernels broke")

    monkeypatch.setattr(gemm_shapes.F, "linear", slow)
    monkeypatch.setattr(plan, "warmup_forward_kernels", kernels_fail)
    report = plan.run_warmup_plan(runner)
    assert not report.succeeded
    assert len(done) == sum(len(ms) for _, ms in gemm_shapes.gemm_plan(runner))
    assert not any(t.name == "warmgate-gemm-sweep" for t in threading.enumerate())


def test_the_cuda_graphs_phase_says_how_long_it_waited_for_the_sweep(
        monkeypatch: pytest.MonkeyPatch, calls: Calls) -> None:
    runner = _runner(monkeypatch, calls, None)
    _plan_with_a_deferred_sweep(monkeypatch, runner)
    report = plan.run_warmup_plan(runner)
    assert report.succeeded
    graphs = next(p for p in report.phases if p.name == CUDA_GRAPHS)
    assert graphs.shapes["waited_for_gemm_sweep_s"] >= 0  # skipped on the CPU, but said
    assert SWEEP in {name for name, what in calls if what == "gemm"}  # beside the forwards
