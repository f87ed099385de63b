"""The GPU diagnostics behind bench/results run on the CPU too, so they cannot rot between
GPU runs: each mode of bench/warm.py first-request, run as its README command is, prints its
table, and bad flags are refused with the reason."""

from __future__ import annotations

import subprocess

import pytest

from tests.bench_harness import run_bench


def first_request(*args: str) -> subprocess.CompletedProcess[str]:
    return run_bench("bench/warm.py first-request", args)


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.slow
def test_first_probe_times_prefill_and_decode_sequences() -> None:
    out = ok(first_request("--mode", "probe", "--first", "decode",
                           "--num-speculative-steps", "1"))
    assert "decode k=1" in out and "after 1.0 s idle" in out and "after 3 prefills" in out
    assert "new segments 0" in out  # the CPU has no caching allocator to grow


def test_first_probe_refuses_segment_tracing_without_cuda() -> None:
    proc = first_request("--mode", "probe", "--trace-segments")
    assert proc.returncode == 2
    assert "--device cuda" in proc.stderr


@pytest.mark.slow
def test_ttft_breakdown_splits_each_request_at_its_first_step() -> None:
    lines = ok(first_request("--mode", "breakdown", "--gap-s", "0", "--repeats", "3",
                             "--prompt-len", "24", "--device", "cpu",
                             "--num-speculative-steps", "2")).splitlines()
    header, first, steady = lines[-3].split(), lines[-2].split(), lines[-1].split()
    assert header[:4] == ["ms", "client", "to_step", "step"]
    assert first[0] == "first" and steady[:2] == ["steady", "median"]
    values = dict(zip(header[1:], map(float, first[1:]), strict=True))
    # The parts of the first step fit inside it, and the step inside the client's TTFT.
    assert values["execute_model"] <= values["step"] <= values["client"]


@pytest.mark.slow
def test_step_profile_lists_functions_for_first_and_steady_steps() -> None:
    out = ok(first_request("--mode", "profile", "--classes", "prefill,decode k=0",
                           "--repeats", "2", "--gap-s", "0", "--top", "3"))
    assert "prefill: first" in out and "decode k=0: first" in out and "mixed" not in out
    assert "steady step's largest own times" in out


def test_step_profile_refuses_a_class_of_another_speculative_length() -> None:
    proc = first_request("--mode", "profile", "--classes", "decode k=3")
    assert proc.returncode != 0
    assert "--num-speculative-steps 0" in proc.stderr


def test_first_batch_runs_only_the_classes_asked_for() -> None:
    out = ok(first_request("--mode", "batch", "--classes", "decode k=0", "--skip-off",
                           "--trials", "1", "--repeats", "2", "--gap-s", "0"))
    rows = [line.split()[0:2] for line in out.splitlines()]
    assert ["decode", "k=0"] in rows and ["prefill"] not in [r[:1] for r in rows]


def test_first_request_without_a_mode_names_the_modes() -> None:
    proc = first_request()
    assert proc.returncode == 2
    assert "--mode" in proc.stderr and "batch" in proc.stderr and "breakdown" in proc.stderr
