"""Drive a ModelRunner with batches the caller chooses, through the serving scheduler's own
parts: its block pool hands out the KV blocks and its step_output builds what the runner
reads and counts what it computed. Only the policy differs: which requests run in a step,
and with how many tokens and drafts, is the caller's (random batches, a benchmark's batch
classes, a test's exact step), where serving.scheduler.Scheduler decides it itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.runner.scheduler_output import (
    ModelRunnerOutput,
    SamplingParams,
    SchedulerOutput,
)
from warmgate.server.serving.block_pool import BlockPool
from warmgate.server.serving.step_output import (
    advance_computed,
    blocks_needed,
    build_scheduler_output,
)


@dataclass
class DrivenRequest:
    """A request as the driver tracks it (the fields serving.step_output reads)."""

    req_id: str
    prompt_token_ids: list[int]
    params: SamplingParams | None  # None for a pooling model
    max_new_tokens: int
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    num_blocks_sent: int = 0
    in_runner: bool = False

    @property
    def prefilling(self) -> bool:
        return self.num_computed_tokens < len(self.prompt_token_ids)

    @property
    def remaining_prompt(self) -> int:
        return len(self.prompt_token_ids) - self.num_computed_tokens

    @property
    def done(self) -> bool:
        return len(self.output_token_ids) >= self.max_new_tokens


@dataclass(frozen=True)
class Work:
    """One request's share of a step: tokens scheduled (drafts included) and the drafts."""

    num_tokens: int
    drafts: tuple[int, ...] = ()


class BatchDriver:
    def __init__(self, runner: ModelRunner, free_ids: Iterable[int] | None = None) -> None:
        """`free_ids`: the KV block ids this driver may hand out, in order (default all)."""
        self.runner = runner
        kv = runner.kv_cache_config
        self.block_size: int = kv.kv_cache_groups[0].kv_cache_spec.block_size
        self.pool = BlockPool(kv.num_blocks, free_ids)
        self.reqs: dict[str, DrivenRequest] = {}
        self._finished: set[str] = set()
        # Each request's work in the last step that scheduled it, for apply_output.
        self._last_work: dict[str, Work] = {}

    def add(self, req: DrivenRequest) -> None:
        self.reqs[req.req_id] = req

    def finish(self, req_id: str) -> None:
        """Out of the driver; the runner drops its state with the next step (or flush)."""
        req = self.reqs.pop(req_id)
        self._last_work.pop(req_id, None)
        self.pool.free(req.block_ids)
        if req.in_runner:
            self._finished.add(req_id)

    def blocks_needed(self, req: DrivenRequest, num_tokens: int) -> int:
        return blocks_needed(req, num_tokens, self.block_size)

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
        """The SchedulerOutput of `plan`, blocks allocated first; pending finishes ride
        along. Call apply_output with the runner's answer."""
        for rid, work in plan.items():
            req = self.reqs[rid]
            need = self.blocks_needed(req, work.num_tokens)
            blocks = self.pool.allocate(need)
            if blocks is None:
                raise RuntimeError(f"{rid}: needs {need} KV blocks, {self.pool.num_free} free "
                                   "(the caller must make room first)")
            req.block_ids += blocks
        so = build_scheduler_output(
            [(self.reqs[rid], w.num_tokens, w.drafts) for rid, w in plan.items()],
            self._finished)
        self._finished = set()
        self._last_work.update(plan)
        return so

    def apply_output(self, out: ModelRunnerOutput) -> None:
        """Follow the runner's output: computed tokens (only accepted drafts count after a
        speculative step) and sampled ones."""
        for rid, tokens in zip(out.req_ids, out.sampled_token_ids, strict=True):
            req, work = self.reqs[rid], self._last_work[rid]
            advance_computed(req, work.num_tokens, len(work.drafts), tokens)
            req.output_token_ids += tokens
