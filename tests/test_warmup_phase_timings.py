"""Issue 16 item 10: when a later sub-phase of the kernels step fails, the one that ended
keeps its own result and seconds, and the failing one gets only its own time."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.runner_helpers import make_runner
from warmgate.server.warmup import PhaseStatus, SkipReason, kernels, run_warmup_plan

PREFILL_SLEEP_S = 0.1
DECODE_SLEEP_S = 0.2


def test_each_phase_reports_its_own_seconds_when_a_later_one_fails(
        monkeypatch: pytest.MonkeyPatch) -> None:
    prefill = kernels.prefill_step

    def slow_prefill(*args: Any, **kwargs: Any) -> None:
        time.sleep(PREFILL_SLEEP_S)
        prefill(*args, **kwargs)

    def failing_decode(*args: Any, **kwargs: Any) -> Any:
        time.sleep(DECODE_SLEEP_S)
        raise RuntimeError("decode kernel exploded")

    monkeypatch.setattr(kernels, "prefill_step", slow_prefill)
    monkeypatch.setattr(kernels, "decode_step", failing_decode)
    report = run_warmup_plan(make_runner(max_num_seqs=4))
    pre, dec = report.phase("kernels.prefill"), report.phase("kernels.decode")
    assert not report.succeeded
    assert pre.status is PhaseStatus.RAN and pre.duration_s >= PREFILL_SLEEP_S
    assert pre.num_reqs == 4 and pre.shapes["prompt_len"] == 2  # its real result
    assert dec.status is PhaseStatus.FAILED and "decode kernel exploded" in dec.detail
    assert DECODE_SLEEP_S <= dec.duration_s < DECODE_SLEEP_S + PREFILL_SLEEP_S
    for later in ("mixed", "cuda_graphs", "kernels.sampler", "structured"):
        assert report.phase(later).skip_reason is SkipReason.EARLIER_PHASE_FAILED
