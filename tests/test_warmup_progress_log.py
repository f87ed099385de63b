"""A long warmup phase is not silent: `python -m warmgate.server.run_warmup` (and
`warmgate-server --warmup-only`) print a line while a phase runs past a few seconds, then
one every few seconds, naming the phase, its place in the plan and the steps done."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

from tests.bench_harness import ROOT, user_env
from warmgate.server.core import progress_log
from warmgate.server.core.phases import (
    CUDA_GRAPHS,
    LOAD,
    PLAN_PHASES,
    SAMPLER,
    TP_PLAN_PHASES,
)
from warmgate.server.core.progress import ProgressEvent
from warmgate.server.core.progress_log import ProgressLog, plan_names


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_phase_gets_a_line_after_the_quiet_time_then_one_per_interval() -> None:
    clock = Clock()
    log = ProgressLog(PLAN_PHASES, clock=clock)
    log.begin(LOAD)
    clock.now += progress_log.QUIET_S - 0.1
    assert log.due() is None  # a short load says nothing of its own
    clock.now += 0.2
    assert log.due() == ("warmup progress: phase load (1/11) running for 5 s, no step done "
                         "yet; 5 s in all")
    clock.now += progress_log.INTERVAL_S - 0.5
    assert log.due() is None  # one line per interval, not per look
    clock.now += 0.5
    assert log.due() is not None
    # The load ends; the sampler's steps count, and its time is its own.
    log(ProgressEvent(LOAD, 1, 1))
    clock.now += 1.0
    log(ProgressEvent(SAMPLER, 3, 25, 8, 11))
    clock.now += progress_log.QUIET_S
    assert log.due() == ("warmup progress: phase kernels.sampler (9/11) running for 5 s, "
                         "step 3/25 done; 21 s in all")


def test_the_phase_after_the_last_one_that_ended_is_the_one_named() -> None:
    """The plan says when a step ends, not when a phase begins: between a phase's end and the
    next one's first step, the next phase in the plan is the one running."""
    clock = Clock()
    log = ProgressLog(PLAN_PHASES, clock=clock)
    log(ProgressEvent(CUDA_GRAPHS, 1, 1, 7, 11))
    clock.now += progress_log.QUIET_S
    assert log.due() == ("warmup progress: phase kernels.sampler (9/11) running for 5 s, "
                         "no step done yet; 5 s in all")
    log(ProgressEvent(PLAN_PHASES[-1], 1, 1, 10, 11))  # the last phase ended: nothing runs
    clock.now += progress_log.INTERVAL_S * 3
    assert log.due() is None


def test_a_tensor_parallel_plan_counts_its_distributed_phase() -> None:
    assert plan_names(1) == PLAN_PHASES and plan_names(2) == TP_PLAN_PHASES


SLOWED_SAMPLER = textwrap.dedent("""
    import sys, time
    from warmgate.server import run_warmup
    from warmgate.server.core import progress_log
    from warmgate.server.warmup import plan

    # Lines every 0.2 s after 0.1 s; 25 steps 0.03 s longer keep the phase running for at
    # least 0.75 s on any machine, so at least three lines fall inside it.
    progress_log.QUIET_S, progress_log.INTERVAL_S, progress_log.TICK_S = 0.1, 0.2, 0.02
    real = plan.warmup_sampler

    def slowed(runner, execute, sample, **kw):  # every sampler step 0.03 s longer
        def slow_execute(*a, **k):
            time.sleep(0.03)
            return execute(*a, **k)
        return real(runner, slow_execute, sample, **kw)

    plan.warmup_sampler = slowed
    sys.exit(run_warmup.main(sys.argv[1:]))
""")


@pytest.mark.slow
def test_run_warmup_prints_progress_while_the_sampler_phase_runs() -> None:
    proc = subprocess.run([sys.executable, "-c", SLOWED_SAMPLER], cwd=ROOT, env=user_env(),
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    ended = next(i for i, line in enumerate(lines) if "phase=kernels.sampler status=RAN" in line)
    during = [line.split("warmup progress: ", 1)[1] for line in lines[:ended]
              if "warmup progress: phase kernels.sampler (9/11) running for" in line]
    assert len(during) >= 2, proc.stderr[-3000:]
    assert any(re.search(r"step [1-9]\d*/\d+ done", line) for line in during), during
    assert "outcome SUCCEEDED" in proc.stdout
