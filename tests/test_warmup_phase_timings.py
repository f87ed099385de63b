"""Issue 16 item 10: when a later sub-phase of the kernels step fails, the ones that ended
keep their own results and seconds, and the failing one gets only its own time."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.runner_helpers import make_runner
from warmgate.server.warmup import PhaseStatus, SkipReason, kernels, run_warmup_plan

DECODE_SLEEP_S = 0.1
SAMPLER_SLEEP_S = 0.2


def test_each_phase_reports_its_own_seconds_when_a_later_one_fails(
        monkeypatch: pytest.MonkeyPatch) -> None:
    decode = kernels._decode

    def slow_decode(*args: Any, **kwargs: Any) -> tuple[int, int]:
        time.sleep(DECODE_SLEEP_S)
        return decode(*args, **kwargs)

    def failing_sampler(*args: Any, **kwargs: Any) -> Any:
        time.sleep(SAMPLER_SLEEP_S)
        raise RuntimeError("sampler kernel exploded")

    monkeypatch.setattr(kernels, "_decode", slow_decode)
    monkeypatch.setattr(kernels, "_warmup_sampler", failing_sampler)
    report = run_warmup_plan(make_runner(max_num_seqs=4))
    prefill, dec, sampler = (report.phase(n) for n in
                             ("kernels.prefill", "kernels.decode", "kernels.sampler"))
    assert not report.succeeded
    assert prefill.status is PhaseStatus.RAN and prefill.duration_s > 0
    assert prefill.num_reqs == 4 and prefill.shapes["prompt_len"] == 2  # its real result
    assert dec.status is PhaseStatus.RAN and dec.num_steps == 3
    assert dec.duration_s >= 3 * DECODE_SLEEP_S
    assert sampler.status is PhaseStatus.FAILED and "sampler kernel exploded" in sampler.detail
    assert SAMPLER_SLEEP_S <= sampler.duration_s < SAMPLER_SLEEP_S + DECODE_SLEEP_S
    assert report.phase("mixed").skip_reason is SkipReason.EARLIER_PHASE_FAILED
