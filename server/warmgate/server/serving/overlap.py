"""Overlapped scheduling on the serving side: what stops the next step from being scheduled
while the last one is still on the device, and the step in flight.

With --async-scheduling the loop launches step N, advances its requests by one pending token
each (step_output.advance_launched), schedules and launches step N+1, and only then waits for
N's tokens. A step whose scheduling needs N's tokens on the host runs after them instead:
that is a serial step, counted by reason (warmgate_serial_steps_total).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from warmgate.server.runner.scheduler_output import ModelRunnerOutput
from warmgate.server.serving.scheduler import Scheduler
from warmgate.server.serving.step_output import StepPlan, blocks_needed

# Every reason a step runs serially: the four the scheduler finds below, and the runner's
# (runner/sampling/step.py host_sampling_reason, ModelRunner.sample_tokens_async).
SERIAL_REASONS = ("grammar", "spec_decode", "penalties", "preemption", "logprobs",
                  "tensor_parallel")


def overlap_blocker(scheduler: Scheduler) -> str | None:
    """Why the next step cannot be scheduled before the pending tokens are on the host, or
    None. A pending request with a grammar needs its bitmask built from the token; with
    drafts its drafter needs it (and the accepted count moves its position); penalties read
    its output history. And a step that may preempt must not: a preempted request restarts
    from its outputs, which the host does not have yet."""
    pending = [r for r in scheduler.running if r.num_pending_tokens]
    if any(r.grammar is not None for r in pending):
        return "grammar"
    if scheduler.limits.num_speculative_steps and any(r.drafter is not None for r in pending):
        return "spec_decode"
    if any(r.params.has_penalties for r in pending):
        return "penalties"
    # Each running request takes at most all its uncomputed tokens (within the token budget)
    # this step: if the free blocks hold that, schedule() never preempts.
    budget = scheduler.limits.max_num_batched_tokens
    need = sum(blocks_needed(r, min(r.num_uncomputed_tokens, budget),
                             scheduler.limits.block_size) for r in scheduler.running)
    if need > scheduler.pool.num_free:
        return "preemption"
    return None


class LaunchedOutput(Protocol):
    """The runner's answer to sample_tokens_async (runner/async_output.py AsyncModelOutput)."""

    sync_reason: str | None

    def get(self) -> ModelRunnerOutput: ...


@dataclass
class InFlight:
    """A launched step whose tokens the host has not read yet."""

    plan: StepPlan
    output: LaunchedOutput
    start_s: float
    # Why this step ran serially (None: it overlapped with the step before it).
    serial_reason: str | None = None
