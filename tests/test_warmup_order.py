"""The plan captures the CUDA graphs after the forward's warmups (prefill, decode, mixed) and
before the sampler's paths, so the sampler's decode steps replay the graphs serving replays."""

from __future__ import annotations

from typing import Any

import pytest

from tests.runner_helpers import make_runner
from tests.warmup_fakes import fail_execute, fail_sample, fake_runner
from warmgate.server.core.results import PhaseResult, PhaseStatus, SkipReason
from warmgate.server.runner.scheduler_output import SchedulerOutput
from warmgate.server.warmup import graphs_phase, plan
from warmgate.server.warmup.sampler_phase import warmup_sampler

MIXED_PHASE_IDS = {"_warmup_mixed_decode", "_warmup_mixed_prefill"}


def _batch_names(so: SchedulerOutput) -> list[str]:
    """The warmup batch each scheduled request belongs to: its id without the index, or
    "mixed phase" for the mixed phase's two requests."""
    ids = [r.req_id for r in so.scheduled_new_reqs] + so.scheduled_cached_reqs.req_ids
    return sorted({"mixed phase" if i in MIXED_PHASE_IDS else i.rsplit("_", 1)[0]
                   for i in ids})


def test_the_graphs_are_captured_between_the_forward_warmups_and_the_sampler(
        monkeypatch: pytest.MonkeyPatch) -> None:
    runner = make_runner(max_num_seqs=4)
    seen: list[str] = []  # batch names in the order their steps ran, "graphs" for the capture
    execute = runner.execute_model

    def recording_execute(so: SchedulerOutput) -> Any:
        seen.extend(_batch_names(so))
        return execute(so)

    def recording_capture(_runner: Any, _force: bool) -> PhaseResult:
        seen.append("graphs")
        return PhaseResult(name="cuda_graphs", status=PhaseStatus.RAN)

    runner.execute_model = recording_execute  # type: ignore[method-assign]
    monkeypatch.setattr(graphs_phase, "cuda_graphs_phase", recording_capture)
    report = plan.run_warmup_plan(runner)
    assert report.succeeded
    graphs = seen.index("graphs")
    before, after = seen[:graphs], seen[graphs + 1:]
    # The forward's own warmups: the kernel requests and the mixed step's.
    assert set(before) == {"_warmup", "mixed phase"}
    # Every sampler batch (greedy first, every feature mixed last) after the capture.
    assert after[0] == "_warmup_greedy" and after[-1] == "_warmup_features_mixed"
    assert {"_warmup_seeded", "_warmup_mixed", "_warmup_logprobs"} <= set(after)
    assert not {"_warmup", "mixed phase"} & set(after)
    assert [p.name for p in report.phases][-4:] == ["cuda_graphs", "kernels.sampler",
                                                   "structured", "determinism"]


def test_a_failing_sampler_keeps_the_graphs_and_fails_the_plan(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_sampler(*_args: Any, **_kwargs: Any) -> PhaseResult:
        raise RuntimeError("sampler kernel exploded")

    monkeypatch.setattr(plan, "warmup_sampler", failing_sampler)
    report = plan.run_warmup_plan(make_runner(max_num_seqs=4))
    assert not report.succeeded
    assert report.phase("mixed").status is PhaseStatus.RAN
    assert report.phase("cuda_graphs").status is PhaseStatus.SKIPPED  # no CUDA here
    sampler = report.phase("kernels.sampler")
    assert sampler.status is PhaseStatus.FAILED and "sampler kernel exploded" in sampler.detail
    assert report.phase("structured").status is PhaseStatus.SKIPPED


def test_the_sampler_phase_alone_skips_what_cannot_fit_and_touches_nothing() -> None:
    runner = fake_runner(num_blocks=1)  # block 0 is the null block: no request fits
    phase = warmup_sampler(runner, fail_execute, fail_sample)
    assert phase.status is PhaseStatus.SKIPPED
    assert phase.skip_reason is SkipReason.INSUFFICIENT_KV_BLOCKS
    pooling = warmup_sampler(fake_runner(is_pooling=True), fail_execute, fail_sample)
    assert pooling.skip_reason is SkipReason.POOLING_MODEL
