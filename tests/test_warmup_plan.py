"""The whole plan on the real tiny runner, on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from google.protobuf import json_format

from warmgate.server.config.runner_config import ModelConfig, RunnerConfig, SpeculativeConfig
from warmgate.server.warmup import (
    PHASES,
    PhaseStatus,
    ProgressEvent,
    SkipReason,
    load_runner,
    run_mixed_warmup,
    run_warmup_plan,
)
from warmgate.v1 import warmup_pb2 as pb

ROOT = Path(__file__).resolve().parents[1]
CPU_PHASES = ("load", "kernels.prefill", "kernels.decode", "kernels.sampler", "mixed")


def _config(num_spec: int = 0, pooling: bool = False) -> RunnerConfig:
    return RunnerConfig(model=ModelConfig.from_preset("tiny", is_pooling_model=pooling),
                        speculative=SpeculativeConfig(num_speculative_steps=num_spec))


@pytest.mark.parametrize("num_spec", [0, 3])
def test_full_plan_runs_every_cpu_phase(num_spec: int) -> None:
    runner, load = load_runner(_config(num_spec))
    events: list[ProgressEvent] = []
    report = run_warmup_plan(runner, load_phase=load, progress=events.append)
    assert report.succeeded
    assert [p.name for p in report.phases] == list(PHASES)
    for name in CPU_PHASES:
        phase = report.phase(name)
        assert phase.status is PhaseStatus.RAN, phase
        assert phase.duration_s > 0
    assert report.phase("flashinfer").skip_reason is SkipReason.BACKEND_NOT_SELECTED
    assert report.phase("cuda_graphs").skip_reason is SkipReason.NO_CUDA
    assert report.phase("kernels.prefill").shapes["prompt_len"] == 2 + num_spec
    assert report.phase("kernels.decode").num_steps == (5 if num_spec else 3)
    assert report.total_duration_s >= sum(p.duration_s for p in report.phases) * 0.99
    # Progress covers the plan in order and finishes every phase it ran.
    indices = [e.phase_index for e in events]
    assert indices == sorted(indices)
    assert {e.phase for e in events if e.steps_done == e.steps_total} >= set(CPU_PHASES[1:])
    # Warmup leaves no request behind in the runner.
    assert runner.input_batch.requests == {}


def test_pooling_plan_prefills_only() -> None:
    runner, load = load_runner(_config(pooling=True))
    report = run_warmup_plan(runner, load_phase=load)
    assert report.succeeded
    assert report.phase("kernels.prefill").status is PhaseStatus.RAN
    for name in ("kernels.decode", "kernels.sampler", "mixed"):
        assert report.phase(name).skip_reason is SkipReason.POOLING_MODEL


def test_a_failing_phase_is_reported_with_the_setting_to_change(
        monkeypatch: pytest.MonkeyPatch) -> None:
    runner, load = load_runner(_config())
    real = runner.execute_model

    def oom_on_decode(so):  # type: ignore[no-untyped-def]
        if so.scheduled_cached_reqs.req_ids:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(so)

    monkeypatch.setattr(runner, "execute_model", oom_on_decode)
    report = run_warmup_plan(runner, load_phase=load)
    assert not report.succeeded
    # The prefill finished; the first decode step raised.
    assert report.phase("kernels.prefill").status is PhaseStatus.RAN
    failed = report.phase("kernels.decode")
    assert failed.status is PhaseStatus.FAILED
    assert "out of memory" in failed.detail and "--max-num-batched-tokens" in failed.detail
    for name in ("kernels.sampler", "mixed", "cuda_graphs"):
        assert report.phase(name).skip_reason is SkipReason.EARLIER_PHASE_FAILED
    # The runner is still usable: a retry without the fault succeeds.
    monkeypatch.setattr(runner, "execute_model", real)
    assert run_warmup_plan(runner).succeeded


def test_a_failure_mid_phase_is_blamed_on_that_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    """The second decode step raises: decode started (reported a step) but did not finish."""
    runner, load = load_runner(_config())
    real = runner.execute_model
    decode_steps = []

    def oom_on_second_decode(so):  # type: ignore[no-untyped-def]
        if so.scheduled_cached_reqs.req_ids:
            decode_steps.append(so)
            if len(decode_steps) == 2:
                raise torch.OutOfMemoryError("CUDA out of memory")
        return real(so)

    monkeypatch.setattr(runner, "execute_model", oom_on_second_decode)
    report = run_warmup_plan(runner, load_phase=load)
    assert report.phase("kernels.decode").status is PhaseStatus.FAILED
    assert report.phase("kernels.sampler").skip_reason is SkipReason.EARLIER_PHASE_FAILED


@pytest.mark.parametrize(("num_tokens", "status"), [(2, PhaseStatus.SKIPPED),
                                                     (24, PhaseStatus.RAN)])
def test_mixed_warmup_report(num_tokens: int, status: PhaseStatus) -> None:
    runner, _ = load_runner(_config())
    report = run_mixed_warmup(runner, num_tokens)
    assert report.succeeded and [p.name for p in report.phases] == ["mixed"]
    assert report.phases[0].status is status
    if status is PhaseStatus.SKIPPED:
        assert report.phases[0].skip_reason is SkipReason.NUM_TOKENS_LT_3


def test_module_entry_point_prints_the_phase_table() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "client"),
                                                        str(ROOT / "server")])}
    proc = subprocess.run([sys.executable, "-m", "warmgate.server.run_warmup", "--json"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    report = json_format.Parse(proc.stdout, pb.WarmupReport())  # the CLI's schema, strictly
    assert report.outcome == pb.WARMUP_OUTCOME_SUCCEEDED
    assert [p.name for p in report.phases] == list(PHASES)
    table = subprocess.run([sys.executable, "-m", "warmgate.server.run_warmup"], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=120,
                           check=True).stdout
    assert "kernels.decode" in table and "NO_CUDA" in table and "outcome SUCCEEDED" in table


def test_module_entry_point_takes_the_servers_runner_flags(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Same names, parsing and errors as warmgate-server: a bad value names its flag."""
    from warmgate.server.run_warmup import main

    for argv, flag in ((["--model", "nope"], "--model"),
                       (["--num-speculative-steps", "-1"], "--num-speculative-steps"),
                       (["--max-num-seqs", "0"], "--max-num-seqs")):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
        assert f"argument {flag}" in capsys.readouterr().err


def test_devtools_runner_flags_build_the_servers_runner_config() -> None:
    import argparse

    from warmgate.server.devtools.runner_setup import add_runner_args, runner_config

    p = argparse.ArgumentParser()
    add_runner_args(p)
    args = p.parse_args(["--no-shape-sweeps", "--compile", "--max-num-seqs", "4"])
    config = runner_config(args, num_speculative_steps=2)
    assert config.device.device == "cpu"  # the benchmarks' default, not the server's auto
    assert config.compilation.compile and not config.compilation.shape_sweeps
    assert config.scheduler.max_num_seqs == 4
    assert config.speculative.num_speculative_steps == 2
