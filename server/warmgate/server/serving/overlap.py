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
    limits = scheduler.limits
    spec = limits.num_speculative_steps > 0
    for r in scheduler.running:  # every step, over every running request: kept lean
        if r.num_pending_tokens:
            if r.grammar is not None:
                return "grammar"
            if spec and r.drafter is not None:
                return "spec_decode"
            if r.params.has_penalties:
                return "penalties"
    # A step schedules at most the token budget, each request's tokens from its last block
    # on: with that many blocks free, schedule() never preempts, whatever the requests hold.
    budget, block_size, free = limits.max_num_batched_tokens, limits.block_size, \
        scheduler.pool.num_free
    if free >= -(-budget // block_size) + len(scheduler.running):
        return None
    # Else each request's own bound: all its uncomputed tokens (within the budget).
    need = sum(blocks_needed(r, min(r.num_uncomputed_tokens, budget), block_size)
               for r in scheduler.running)
    if need > free:
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
