"""Continuous batching over the paged KV cache: what runs in each step.

Each step, in this order (vLLM V1's policy, trimmed):
1. Running requests, oldest first: a decoding request gets its last sampled token plus up to
   num_speculative_steps drafts; one still prefilling gets the next chunk of its prompt that
   the token budget allows (chunked prefill). When the KV cache cannot hold a request's new
   tokens, the newest running request is preempted (its blocks freed; it restarts later by
   recomputing prompt + outputs) until it can, or until the request itself is the newest.
2. Waiting requests, first come first served, while max_num_seqs, the token budget and free
   blocks allow; none are admitted in a step that had to preempt (they would take the blocks
   the preempted request needs back).
In a step where running requests decode, prompt tokens (chunks of running prefills and new
requests alike) take at most max_prefill_tokens_while_decoding of the budget: a decoding
stream's next token waits for the whole step, so its prompts bound the inter-token latency.
So one step can mix prefill chunks and decodes, and a request enters the batch the step after
it arrives. The scheduler never touches the runner: it builds a SchedulerOutput and reads the
ModelRunnerOutput back.
"""

from __future__ import annotations

import logging
from collections import deque

from warmgate.server.config.runner_config import cdiv
from warmgate.server.runner.scheduler_output import (
    ModelRunnerOutput,
    SchedulerOutput,
    TokenLogprobs,
)
from warmgate.server.serving.block_pool import BlockPool
from warmgate.server.serving.grammar.spec import GrammarViolation
from warmgate.server.serving.limits import SchedulerLimits
from warmgate.server.serving.request import (
    FinishReason,
    RequestStatus,
    ServingRequest,
    StepEvent,
)
from warmgate.server.serving.step_output import (
    ScheduledWork,
    StepPlan,
    blocks_needed,
    build_scheduler_output,
    ends_on_pending,
    settle_step,
)

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, limits: SchedulerLimits) -> None:
        self.limits = limits
        self.pool = BlockPool(limits.num_blocks)
        self.waiting: deque[ServingRequest] = deque()
        self.running: list[ServingRequest] = []
        # Requests the runner holds state for that must be dropped before the next step.
        self._drop: set[str] = set()
        self.num_preemptions = 0

    # -- requests in and out ------------------------------------------------------------

    def add(self, req: ServingRequest) -> None:
        self.waiting.append(req)

    def abort(self, req_id: str) -> bool:
        """Drop a request wherever it is (a cancelled stream); its blocks are freed now."""
        for req in (*self.waiting, *self.running):
            if req.req_id == req_id:
                self._finish(req)
                return True
        return False

    @property
    def has_requests(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def has_runner_work(self) -> bool:
        """Something for the runner to do: requests, or runner state still to drop."""
        return self.has_requests or bool(self._drop)

    @property
    def num_blocks_used(self) -> int:
        return self.pool.num_usable - self.pool.num_free

    def preempt_all(self) -> None:
        """Free every running request's blocks (they recompute later), e.g. before a warmup
        that writes into the KV cache."""
        for req in reversed(list(self.running)):
            self._preempt(req)

    # -- one step -----------------------------------------------------------------------

    def schedule(self, now: float) -> StepPlan:
        budget = self.limits.max_num_batched_tokens
        prompt_room = self._prompt_room(budget)
        work: list[ScheduledWork] = []
        errors: list[StepEvent] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            if ends_on_pending(req, self.limits.max_model_len):
                i += 1  # its last token is in flight; the update finishes it
                continue
            drafts = self._drafts(req, budget)
            prefill = req.num_uncomputed_tokens != 1
            n = (min(req.num_uncomputed_tokens, budget, prompt_room) if prefill
                 else 1 + len(drafts))
            if n == 0:
                i += 1  # this step's prompt tokens are spent; its next chunk waits
                continue
            grown = self._grow(req, n)
            if grown is None:  # admission checks make this unreachable; never loop on it
                self._finish(req)
                errors.append(StepEvent(req.req_id, [], now, error=MemoryError(
                    f"request {req.req_id} needs more KV blocks than the cache holds "
                    f"({self.pool.num_usable}); raise --num-blocks")))
                continue
            if not grown:
                preempted = True
                if req.status is not RequestStatus.RUNNING:
                    break  # it was the newest: it waits, and so does everything after it
                continue  # the same request again, now that a newer one gave up its blocks
            work.append(ScheduledWork(req, n, tuple(drafts), prompt=prefill))
            budget -= n
            prompt_room -= n if prefill else 0
            i += 1
        while (self.waiting and not preempted and min(budget, prompt_room) > 0
               and len(self.running) < self.limits.max_num_seqs):
            req = self.waiting[0]
            n = min(req.num_uncomputed_tokens, budget, prompt_room)
            blocks = self.pool.allocate(cdiv(n, self.limits.block_size))
            if blocks is None:
                break  # waits for blocks to come free
            self.waiting.popleft()
            req.block_ids, req.status = blocks, RequestStatus.RUNNING
            self.running.append(req)
            work.append(ScheduledWork(req, n, prompt=True))
            budget -= n
            prompt_room -= n
        for w in work:
            if w.req.usage.first_scheduled_s is None:
                w.req.usage.first_scheduled_s = now
        return StepPlan(self._scheduler_output(work), work, errors)

    def update(self, plan: StepPlan, out: ModelRunnerOutput | None, now: float
               ) -> list[StepEvent]:
        """Advance every scheduled request by what the runner produced; returns an event per
        request that got tokens, and finishes the ones that are done."""
        produced: dict[str, list[int]] = {}
        logprobs: dict[str, list[TokenLogprobs]] = {}
        if out is not None:
            produced = dict(zip(out.req_ids, out.sampled_token_ids, strict=True))
            logprobs = dict(zip(out.req_ids, out.logprobs or [], strict=False))
        events = []
        for w in plan.work:
            req = w.req
            if req.status is not RequestStatus.RUNNING:
                continue  # aborted while the step ran
            req.usage.num_steps += 1
            if out is not None and req.req_id in out.prompt_logprobs:
                req.add_prompt_logprobs(out.prompt_logprobs[req.req_id])
            tokens = produced.get(req.req_id, [])
            settle_step(req, w, tokens, plan.advanced)
            if not tokens:  # a prefill chunk short of the end of the stream
                continue
            accepted = len(tokens) - 1
            req.usage.num_draft_tokens += len(w.draft_token_ids)
            req.usage.num_accepted_draft_tokens += accepted
            try:
                events.append(self._append(req, tokens, now, len(w.draft_token_ids), accepted,
                                           logprobs.get(req.req_id, [])))
            except GrammarViolation as exc:
                self._finish(req)
                events.append(StepEvent(req.req_id, [], now, error=exc))
        return events

    def fail(self, plan: StepPlan, error: BaseException, now: float) -> list[StepEvent]:
        """End every request of a step that raised (the runner state is dropped too)."""
        events = []
        for w in plan.work:
            if w.req.status is RequestStatus.RUNNING:
                self._finish(w.req)
                events.append(StepEvent(w.req.req_id, [], now, error=error))
        return events

    def drop_only_output(self) -> SchedulerOutput:
        """A step that schedules nothing and only drops finished requests' runner state."""
        return self._scheduler_output([])

    # -- internals ----------------------------------------------------------------------

    def _prompt_room(self, budget: int) -> int:
        """Prompt tokens this step may take: the budget, or the bound while requests decode."""
        bound = self.limits.max_prefill_tokens_while_decoding
        if bound and any(r.num_uncomputed_tokens == 1 for r in self.running):
            return min(bound, budget)
        return budget

    def _drafts(self, req: ServingRequest, budget: int) -> list[int]:
        """Up to num_speculative_steps drafts for a decoding request.

        A request the drafter has nothing for is padded with its last token, so every
        decoding request has the same query length (1 + k) and the batch stays a uniform
        decode that replays a captured CUDA graph; a padded draft is simply rejected. Fewer
        drafts only near max_tokens, max_model_len or the end of the token budget.
        """
        k = self.limits.num_speculative_steps
        if k == 0 or req.drafter is None or req.num_uncomputed_tokens != 1:
            return []
        room = min(k, budget - 1, req.num_tokens_left - 1,
                   self.limits.max_model_len - req.num_tokens)
        if room <= 0:
            return []
        drafts = req.drafter.propose(room)
        last = req.output_token_ids[-1] if req.output_token_ids else req.prompt_token_ids[-1]
        return drafts + [last] * (room - len(drafts))

    def _grow(self, req: ServingRequest, num_new_tokens: int) -> bool | None:
        """Give req the blocks for num_new_tokens more, preempting newer requests if needed.

        True when it has them; False when a request was preempted for them (req itself, if it
        was the newest; otherwise call again); None when even an empty cache cannot hold it.
        """
        need = blocks_needed(req, num_new_tokens, self.limits.block_size)
        if need <= 0:
            return True
        blocks = self.pool.allocate(need)
        if blocks is not None:
            req.block_ids += blocks
            return True
        victim = self.running[-1]
        if victim is req and len(self.running) == 1:
            return None
        self._preempt(victim)
        return False

    def _preempt(self, req: ServingRequest) -> None:
        self._release(req)
        req.status = RequestStatus.WAITING
        req.num_computed_tokens = 0
        req.usage.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)
        logger.info("preempted %s (%d tokens to recompute; %d blocks free, %d running)",
                    req.req_id, req.num_tokens, self.pool.num_free, len(self.running))

    def _finish(self, req: ServingRequest, reason: FinishReason | None = None) -> None:
        """Out of the scheduler for good (None: aborted or failed, no finish reason)."""
        if req in self.waiting:
            self.waiting.remove(req)
        self._release(req)
        req.status, req.finish_reason = RequestStatus.FINISHED, reason

    def _release(self, req: ServingRequest) -> None:
        if req in self.running:
            self.running.remove(req)
        self.pool.free(req.block_ids)
        req.block_ids, req.num_blocks_sent = [], 0
        if req.in_runner:
            self._drop.add(req.req_id)
            req.in_runner = False

    def _append(self, req: ServingRequest, tokens: list[int], now: float, num_drafts: int,
                accepted: int, logprobs: list[TokenLogprobs]) -> StepEvent:
        """Append sampled tokens up to the first stop condition; finish the request there."""
        kept: list[int] = []
        reason: FinishReason | None = None
        for token in tokens:
            kept.append(token)
            req.output_token_ids.append(token)
            # A grammar ends once complete and past the EOS it then allows (vLLM's rule).
            grammar_done = req.grammar is not None and req.grammar.accept(token)
            if grammar_done or token in req.params.stop_token_ids:
                reason = FinishReason.STOP
            elif req.num_tokens_left <= 0:
                reason = FinishReason.LENGTH
            elif req.num_tokens - req.num_pending_tokens >= self.limits.max_model_len:
                reason = FinishReason.MAX_MODEL_LEN
            if reason is not None:
                break
        if req.drafter is not None:
            req.drafter.extend(kept)
        if req.usage.first_token_s is None:
            req.usage.first_token_s = now
        if reason is not None:
            self._finish(req, reason)
        return StepEvent(req.req_id, kept, now, num_drafts, accepted, reason,
                         req.usage if reason is not None else None,
                         logprobs=logprobs[:len(kept)],
                         prompt_logprobs=req.take_prompt_logprobs())

    def _scheduler_output(self, work: list[ScheduledWork]) -> SchedulerOutput:
        so = build_scheduler_output(
            [(w.req, w.num_tokens, w.draft_token_ids) for w in work], self._drop)
        self._drop = set()
        return so
