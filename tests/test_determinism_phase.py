"""The warmup's `determinism` phase: RAN under --deterministic, SKIPPED without it, and FAILED
(the plan with it, naming the first differing output position) when a batch-dependent op is
injected into the runner."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from tests.runner_helpers import tiny_config
from warmgate.server.core.phases import DETERMINISM
from warmgate.server.core.results import PhaseStatus, SkipReason
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.warmup.determinism import first_difference, run_determinism_check
from warmgate.server.warmup.plan import run_warmup_plan


def runner(deterministic: bool, **kw: object) -> ModelRunner:
    c = tiny_config(**kw)  # type: ignore[arg-type]
    return ModelRunner(dataclasses.replace(
        c, numerics=dataclasses.replace(c.numerics, deterministic=deterministic)))


def batch_dependent_linear(x: torch.Tensor, weight: torch.Tensor,
                           bias: torch.Tensor | None = None) -> torch.Tensor:
    """A projection whose rounding depends on the step's token count, as a GEMM that picks
    its kernel by M does: one ulp-scale nudge per extra row."""
    out = F.linear(x, weight, bias)
    return out * (1.0 + 1e-6 * (x.shape[0] - 1))


@pytest.mark.parametrize("k", [0, 3])
def test_the_phase_runs_and_passes_in_deterministic_mode(k: int) -> None:
    r = runner(True, num_spec=k)
    phase = run_determinism_check(r, r.execute_model, r.sample_tokens)
    assert phase.status is PhaseStatus.RAN, phase.detail
    assert phase.shapes["companions"] > 0 and phase.num_steps > 0
    assert not r.input_batch.requests  # every probe and companion was finished


def test_the_phase_skips_without_deterministic_mode() -> None:
    r = runner(False)
    phase = run_determinism_check(r, r.execute_model, r.sample_tokens)
    assert phase.status is PhaseStatus.SKIPPED
    assert phase.skip_reason is SkipReason.NOT_DETERMINISTIC


@pytest.mark.parametrize("k", [0, 3])
def test_a_batch_dependent_op_fails_the_plan_naming_the_position(
        k: int, monkeypatch: pytest.MonkeyPatch) -> None:
    r = runner(True, num_spec=k)
    # The test hook: every layer and the head call the runner's one ops object.
    monkeypatch.setattr(r.ops, "linear", batch_dependent_linear)
    report = run_warmup_plan(r)
    assert not report.succeeded
    phase = report.phase(DETERMINISM)
    assert phase.status is PhaseStatus.FAILED
    assert "differs at output position" in phase.detail
    assert "inside a mixed batch" in phase.detail


def test_first_difference_names_the_position_and_the_lengths() -> None:
    a = [(5, -1.0, 1), (6, -2.0, 1)]
    assert first_difference(a, list(a)) is None
    diff = first_difference(a, [(5, -1.0, 1), (6, -2.0000002, 1)])
    assert diff is not None and diff.startswith("output position 1:")
    assert first_difference(a, a[:1]) == "output length 2 alone, 1 inside a mixed batch"
