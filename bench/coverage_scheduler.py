"""Just enough of a scheduler to drive a ModelRunner with arbitrary batches.

It owns the KV block pool, sends each request once as new and then as cached, chunks prompts
as told, attaches drafts, and follows the runner's outputs as a real scheduler does: after a
speculative step only the accepted drafts (not the bonus token) count as computed. Which
requests run in a step, and with how many tokens, is the caller's choice (random_batches).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from warmgate.server.config.runner_config import cdiv
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.runner.scheduler_output import (
    CachedRequestData,
    ModelRunnerOutput,
    NewRequestData,
    SamplingParams,
    SchedulerOutput,
)


@dataclass
class Request:
    req_id: str
    prompt: list[int]
    params: SamplingParams | None
    max_new_tokens: int
    blocks: list[int] = field(default_factory=list)
    num_computed: int = 0
    output: list[int] = field(default_factory=list)
    sent: bool = False
    last_scheduled: int = 0
    last_drafts: int = 0

    @property
    def prefilling(self) -> bool:
        return self.num_computed < len(self.prompt)

    @property
    def remaining_prompt(self) -> int:
        return len(self.prompt) - self.num_computed

    @property
    def done(self) -> bool:
        return len(self.output) >= self.max_new_tokens


@dataclass(frozen=True)
class Work:
    """One request's share of a step: tokens scheduled (drafts included) and the drafts."""

    num_tokens: int
    drafts: tuple[int, ...] = ()


class CoverageScheduler:
    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        group = runner.kv_cache_config.kv_cache_groups[0]
        self.block_size = group.kv_cache_spec.block_size
        self.free_blocks = list(range(1, runner.kv_cache_config.num_blocks))  # 0 is null
        self.reqs: dict[str, Request] = {}
        self._finished: set[str] = set()

    def add(self, req: Request) -> None:
        self.reqs[req.req_id] = req

    def finish(self, req_id: str) -> None:
        req = self.reqs.pop(req_id)
        self.free_blocks.extend(req.blocks)
        if req.sent:
            self._finished.add(req_id)

    def blocks_needed(self, req: Request, num_tokens: int) -> int:
        return max(0, cdiv(req.num_computed + num_tokens, self.block_size) - len(req.blocks))

    def step(self, plan: dict[str, Work]) -> ModelRunnerOutput | None:
        """Run one step over `plan` (request id -> work); returns the runner's output."""
        out = self.runner.execute_model(self.build_output(plan))
        if out is None:
            out = self.runner.sample_tokens(None)
        if out is not None:
            self.apply_output(out)
        return out

    def flush(self) -> None:
        """Send pending finishes with an empty step, so the runner drops their state."""
        if self._finished:
            self.runner.execute_model(self.build_output({}))

    def build_output(self, plan: dict[str, Work]) -> SchedulerOutput:
        """The SchedulerOutput of `plan`, blocks allocated (lowest ids first); pending
        finishes ride along. Call apply_output with the runner's answer."""
        new: list[NewRequestData] = []
        cached = CachedRequestData()
        for rid, work in plan.items():
            req = self.reqs[rid]
            need = self.blocks_needed(req, work.num_tokens)
            if need > len(self.free_blocks):
                raise RuntimeError(f"{rid}: needs {need} KV blocks, {len(self.free_blocks)} "
                                   "free (the batch drawer should have made room)")
            # Lowest ids first; in place, and only when the request grows (a decode that
            # stays inside its last block must not copy the whole free list in a timed step).
            fresh = self.free_blocks[:need]
            del self.free_blocks[:need]
            req.blocks += fresh
            if not req.sent:
                new.append(NewRequestData(rid, list(req.prompt), (list(req.blocks),),
                                          req.num_computed, req.params))
                req.sent = True
            else:
                cached.req_ids.append(rid)
                cached.new_block_ids.append((fresh,) if fresh else None)
                cached.num_computed_tokens.append(req.num_computed)
            req.last_scheduled, req.last_drafts = work.num_tokens, len(work.drafts)
        scheduled = {rid: w.num_tokens for rid, w in plan.items()}
        so = SchedulerOutput(
            scheduled_new_reqs=new, scheduled_cached_reqs=cached,
            num_scheduled_tokens=scheduled, total_num_scheduled_tokens=sum(scheduled.values()),
            scheduled_spec_decode_tokens={r: list(w.drafts) for r, w in plan.items() if w.drafts},
            finished_req_ids=self._finished)
        self._finished = set()
        return so

    def apply_output(self, out: ModelRunnerOutput) -> None:
        """Follow the runner's output: computed tokens (only accepted drafts count after a
        speculative step) and sampled ones."""
        for rid, tokens in zip(out.req_ids, out.sampled_token_ids, strict=True):
            req = self.reqs[rid]
            if tokens:
                # The bonus token is not in the KV cache yet; the accepted drafts are.
                req.num_computed += req.last_scheduled - req.last_drafts + len(tokens) - 1
                req.output += tokens
            else:
                req.num_computed += req.last_scheduled
