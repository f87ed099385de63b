"""The GPU diagnostics behind bench/results run on the CPU too, so they cannot rot between
GPU sessions: each prints its table, and bad flags are refused with the reason."""

from __future__ import annotations

import pytest

from bench import first_batch, first_probe, step_profile, ttft_breakdown


def test_first_probe_times_prefill_and_decode_sequences(capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    assert first_probe.main(["--first", "decode", "--num-speculative-steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "decode k=1" in out and "after 1.0 s idle" in out and "after 3 prefills" in out
    assert "new segments 0" in out  # the CPU has no caching allocator to grow


def test_first_probe_refuses_segment_tracing_without_cuda(capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    with pytest.raises(SystemExit):
        first_probe.main(["--trace-segments"])
    assert "--device cuda" in capsys.readouterr().err


def test_ttft_breakdown_splits_each_request_at_its_first_step(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert ttft_breakdown.main(["--gap-s", "0", "--repeats", "3", "--prompt-len", "24",
                                "--device", "cpu", "--num-speculative-steps", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header, first, steady = lines[-3].split(), lines[-2].split(), lines[-1].split()
    assert header[:4] == ["ms", "client", "to_step", "step"]
    assert first[0] == "first" and steady[:2] == ["steady", "median"]
    values = dict(zip(header[1:], map(float, first[1:]), strict=True))
    # The parts of the first step fit inside it, and the step inside the client's TTFT.
    assert values["execute_model"] <= values["step"] <= values["client"]


def test_step_profile_lists_functions_for_first_and_steady_steps(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert step_profile.main(["--classes", "prefill,decode k=0", "--repeats", "2",
                              "--gap-s", "0", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "prefill: first" in out and "decode k=0: first" in out and "mixed" not in out
    assert "steady step's largest own times" in out


def test_step_profile_refuses_a_class_of_another_speculative_length(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        step_profile.main(["--classes", "decode k=3"])
    assert "--num-speculative-steps 0" in capsys.readouterr().err


def test_first_batch_runs_only_the_classes_asked_for(capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    assert first_batch.main(["--classes", "decode k=0", "--skip-off", "--trials", "1",
                             "--repeats", "2", "--gap-s", "0"]) == 0
    rows = [line.split()[0:2] for line in capsys.readouterr().out.splitlines()]
    assert ["decode", "k=0"] in rows and ["prefill"] not in [r[:1] for r in rows]
