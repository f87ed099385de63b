"""A step's batch as the runner reads it, and the runner's answer as a request's progress.

The scheduler decides which requests run and with how many tokens; this module turns that
decision into a SchedulerOutput (new requests whole, cached ones with only the blocks the
runner has not seen) and moves a request's computed tokens by what the step did. It is the
part of scheduling that does not depend on the policy, so the serving scheduler and the
developer tools that choose their own batches (warmgate.server.devtools.batch_driver) send
the runner the same thing for the same batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from warmgate.server.config.runner_config import cdiv
from warmgate.server.runner.scheduler_output import (
    CachedRequestData,
    NewRequestData,
    SamplingParams,
    SchedulerOutput,
)
from warmgate.server.serving.request import ServingRequest, StepEvent


class TrackedRequest(Protocol):
    """What a request must track for its steps to be sent to the runner."""

    req_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    num_computed_tokens: int
    block_ids: list[int]
    num_blocks_sent: int
    in_runner: bool

    @property
    def params(self) -> SamplingParams | None: ...


@dataclass(frozen=True)
class ScheduledWork:
    req: ServingRequest
    num_tokens: int  # drafts included
    draft_token_ids: tuple[int, ...] = ()
    # A chunk of the request's prompt (or of its recompute after a preemption), not a decode.
    prompt: bool = False


@dataclass
class StepPlan:
    scheduler_output: SchedulerOutput
    work: list[ScheduledWork] = field(default_factory=list)
    # Requests the step could not take at all (their streams end with the error).
    errors: list[StepEvent] = field(default_factory=list)
    # Set by advance_launched: the requests were advanced when the step was launched, before
    # its tokens were read (overlapped scheduling).
    advanced: bool = False

    @property
    def is_empty(self) -> bool:
        return not self.work

    @property
    def num_prompt_tokens(self) -> int:
        return sum(w.num_tokens for w in self.work if w.prompt)


def blocks_needed(req: TrackedRequest, num_new_tokens: int, block_size: int) -> int:
    """Blocks req lacks for num_new_tokens more tokens (0 when its last block has room)."""
    return max(0, cdiv(req.num_computed_tokens + num_new_tokens, block_size)
               - len(req.block_ids))


def build_scheduler_output(work: Sequence[tuple[TrackedRequest, int, tuple[int, ...]]],
                           finished_req_ids: set[str]) -> SchedulerOutput:
    """The SchedulerOutput of one step: `work` rows are (request, tokens scheduled with the
    drafts, drafts), each request already holding its blocks. A request the runner does not
    hold yet goes whole (a new or restarted one); the others send only the blocks added since
    their last step. Marks each request as sent."""
    new: list[NewRequestData] = []
    cached = CachedRequestData()
    for req, _, _ in work:
        if not req.in_runner:
            new.append(NewRequestData(
                req_id=req.req_id, prompt_token_ids=list(req.prompt_token_ids),
                block_ids=(list(req.block_ids),), num_computed_tokens=req.num_computed_tokens,
                sampling_params=req.params, output_token_ids=list(req.output_token_ids)))
            req.in_runner = True
        else:
            fresh = req.block_ids[req.num_blocks_sent:]
            cached.req_ids.append(req.req_id)
            cached.new_block_ids.append((fresh,) if fresh else None)
            cached.num_computed_tokens.append(req.num_computed_tokens)
        req.num_blocks_sent = len(req.block_ids)
    scheduled = {req.req_id: n for req, n, _ in work}
    return SchedulerOutput(
        scheduled_new_reqs=new, scheduled_cached_reqs=cached,
        num_scheduled_tokens=scheduled, total_num_scheduled_tokens=sum(scheduled.values()),
        scheduled_spec_decode_tokens={req.req_id: list(d) for req, _, d in work if d},
        finished_req_ids=finished_req_ids)


def advance_computed(req: TrackedRequest, num_tokens: int, num_drafts: int,
                     sampled: Sequence[int]) -> None:
    """Count what a step computed for req. A prefill chunk short of the end of the stream
    samples nothing and computed all it was given; a sampling step keeps only the accepted
    drafts (the rejected ones' KV slots will be overwritten), and the bonus token it sampled
    is not in the KV cache yet."""
    if not sampled:
        req.num_computed_tokens += num_tokens
    else:
        req.num_computed_tokens += num_tokens - num_drafts + len(sampled) - 1


def samples(w: ScheduledWork) -> bool:
    """Whether the step reaches the end of the request's stream (a mid-prompt chunk samples
    nothing); read before the request is advanced by it."""
    return w.num_tokens - len(w.draft_token_ids) == w.req.num_uncomputed_tokens


def advance_launched(plan: StepPlan) -> None:
    """Advance a launched step's requests before its tokens are read, so the next step can be
    scheduled while it runs: a step without drafts computes all it was given whatever it
    samples, and a request that samples gets one pending token (settled by settle_step)."""
    if any(w.draft_token_ids for w in plan.work):
        raise ValueError("a step with drafts is advanced by its accepted tokens, on the host")
    for w in plan.work:
        pending = samples(w)
        w.req.num_computed_tokens += w.num_tokens
        w.req.num_pending_tokens += pending
    plan.advanced = True


def settle_step(req: ServingRequest, w: ScheduledWork, sampled: Sequence[int],
                advanced: bool) -> None:
    """Count what a step computed for req, once its tokens are on the host."""
    if advanced:
        req.num_pending_tokens -= min(len(sampled), req.num_pending_tokens)
    else:
        advance_computed(req, w.num_tokens, len(w.draft_token_ids), sampled)


def ends_on_pending(req: ServingRequest, max_model_len: int) -> bool:
    """Whether the request's pending token finishes it whatever its value (max_tokens or the
    context reached): scheduling it again would only compute a token to throw away."""
    return req.num_pending_tokens > 0 and (
        req.num_tokens_left - req.num_pending_tokens <= 0 or req.num_tokens >= max_model_len)
