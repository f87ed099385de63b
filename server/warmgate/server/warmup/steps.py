"""Building blocks shared by the warmups: hand-built scheduler outputs and a synced timer.

Warmup drives the runner only through `worker_execute_model` / `worker_sample_tokens`, as
vLLM's MRV2 warmup does, so it works unchanged behind a pipeline-parallel worker and against
test fakes.

Why not the serving scheduler (or devtools' batch driver, built on its block pool): the plan
must produce exact shapes (so many requests of so many tokens, drafts on some, a request
restated to its prompt, one step per kernel class) that a policy would not choose, and it
writes into a KV cache no scheduler owns while it runs, across every KV cache group. So the
steps here only spell out SchedulerOutputs the plan has already decided: BlockAllocator hands
out consecutive ids and never frees (the plan finishes its requests and the cache is the
scheduler's again afterwards); nothing here picks requests, budgets tokens or preempts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from warmgate.server.core.results import PhaseResult, PhaseStatus, SkipReason
from warmgate.server.runner.scheduler_output import (
    CachedRequestData,
    GrammarOutput,
    ModelRunnerOutput,
    NewRequestData,
    SamplingParams,
    SchedulerOutput,
)
from warmgate.server.warmup.runner_contract import WarmupRunner
from warmgate.server.warmup.shapes import blocks_for, kernel_shapes, kernel_shortfall

__all__ = ["BlockAllocator", "WarmupRequest", "blocks_for", "decode_step", "finish",
           "kv_block_sizes", "new_request", "prefill_step", "ran_phase", "run_step",
           "scheduler_output", "shortfall_skip", "synced_timer", "warmup_shapes"]

# Why a pooling model's decode and sampler phases are skipped.
POOLING_NEVER_SAMPLES = "a pooling model never decodes or samples"

logger = logging.getLogger(__name__)

# The two callbacks warmup drives the runner through (WarmupRunner.execute_model and
# .sample_tokens, or a pipeline-parallel worker's equivalents).
ExecuteModel = Callable[[SchedulerOutput], ModelRunnerOutput | None]
SampleTokens = Callable[[GrammarOutput | None], ModelRunnerOutput | None]


def kv_block_sizes(model_runner: WarmupRunner) -> list[int]:
    return [g.kv_cache_spec.block_size for g in model_runner.kv_cache_config.kv_cache_groups]


def warmup_shapes(model_runner: WarmupRunner) -> dict[str, int]:
    """The shapes the kernel, sampler and structured warmups use: prompt_len,
    decode_query_len, num_reqs and their caps (warmup/shapes.py)."""
    sched = model_runner.scheduler_config
    return kernel_shapes(num_spec_steps=model_runner.num_speculative_steps,
                         block_sizes=kv_block_sizes(model_runner),
                         num_blocks=model_runner.kv_cache_config.num_blocks,
                         max_num_seqs=sched.max_num_seqs,
                         max_num_batched_tokens=sched.max_num_batched_tokens,
                         max_model_len=model_runner.max_model_len)


class BlockAllocator:
    """Hands out block ids from 1 up (block 0 is the null block), per KV cache group."""

    def __init__(self, num_groups: int) -> None:
        self._next = [1] * num_groups

    def take(self, counts: Sequence[int]) -> tuple[list[int], ...]:
        out = []
        for g, n in enumerate(counts):
            out.append(list(range(self._next[g], self._next[g] + n)))
            self._next[g] += n
        return tuple(out)


@dataclass
class WarmupRequest:
    """The warmup's own view of a request it scheduled: what the scheduler would track."""

    req_id: str
    prompt_len: int
    num_computed_tokens: int = 0
    blocks: list[int] = field(default_factory=list)  # blocks held, per group


def new_request(req_id: str, prompt_token_ids: list[int], block_ids: tuple[list[int], ...],
                sampling_params: SamplingParams | None) -> NewRequestData:
    return NewRequestData(req_id=req_id, prompt_token_ids=prompt_token_ids,
                          block_ids=block_ids, num_computed_tokens=0,
                          sampling_params=sampling_params)


def scheduler_output(new_reqs: Sequence[NewRequestData] = (),
                     cached: Sequence[tuple[str, int, tuple[list[int], ...] | None]] = (),
                     num_scheduled: dict[str, int] | None = None,
                     spec_tokens: dict[str, list[int]] | None = None,
                     finished: set[str] | None = None) -> SchedulerOutput:
    """One step. `cached` rows are (req_id, num_computed_tokens, new_block_ids or None)."""
    num_scheduled = dict(num_scheduled or {})
    cached_data = CachedRequestData(
        req_ids=[r for r, _, _ in cached],
        new_block_ids=[b for _, _, b in cached],
        num_computed_tokens=[c for _, c, _ in cached],
    )
    return SchedulerOutput(
        scheduled_new_reqs=list(new_reqs),
        scheduled_cached_reqs=cached_data,
        num_scheduled_tokens=num_scheduled,
        total_num_scheduled_tokens=sum(num_scheduled.values()),
        scheduled_spec_decode_tokens=dict(spec_tokens or {}),
        finished_req_ids=set(finished or ()),
    )


def run_step(execute: ExecuteModel, sample: SampleTokens, so: SchedulerOutput,
             *, sample_after: bool = True) -> None:
    execute(so)
    if sample_after:
        sample(None)


def shortfall_skip(model_runner: WarmupRunner,
                   shapes: dict[str, int]) -> tuple[SkipReason, str] | None:
    """(reason, detail) when the configuration cannot hold the kernel warmup's requests
    (shapes.kernel_shortfall), else None: the prefill and sampler phases skip alike."""
    short = kernel_shortfall(shapes, model_runner.scheduler_config.max_num_batched_tokens)
    if short is None:
        return None
    reason, _flag, detail = short
    return reason, detail


def prefill_step(execute: ExecuteModel, sample: SampleTokens, reqs: Sequence[WarmupRequest],
                 alloc: BlockAllocator, block_sizes: list[int],
                 params: Sequence[SamplingParams], *, is_pooling: bool) -> None:
    """One step in which every request of `reqs` reads its whole prompt."""
    new = []
    for req, sp in zip(reqs, params, strict=True):
        blocks = alloc.take(blocks_for(req.prompt_len, block_sizes))
        req.blocks = [len(b) for b in blocks]
        new.append(new_request(req.req_id, list(range(req.prompt_len)), blocks,
                               None if is_pooling else sp))
    so = scheduler_output(new_reqs=new, num_scheduled={r.req_id: r.prompt_len for r in reqs})
    run_step(execute, sample, so, sample_after=not is_pooling)
    for req in reqs:
        req.num_computed_tokens = req.prompt_len


def decode_step(execute: ExecuteModel, sample: SampleTokens, reqs: Sequence[WarmupRequest],
                rows: Sequence[tuple[int, bool]], num_spec_steps: int, alloc: BlockAllocator,
                block_sizes: list[int], tokens_per_req: int) -> tuple[int, int]:
    """One decode step over `rows` (request index, has drafts); returns (tokens scheduled,
    requests restated back)."""
    cached, num_scheduled, spec_tokens = [], {}, {}
    restated = 0
    for idx, has_drafts in rows:
        req = reqs[idx]
        k = num_spec_steps if has_drafts else 0
        if req.num_computed_tokens + 1 + k > tokens_per_req:
            # Past its blocks or max_model_len: back to the end of its prompt (a scheduler
            # restates rejected drafts the same way); still a decode, never a prefill.
            req.num_computed_tokens = req.prompt_len
            restated += 1
        need = blocks_for(req.num_computed_tokens + 1 + k, block_sizes)
        delta = [max(0, n - h) for n, h in zip(need, req.blocks, strict=True)]
        new_blocks = alloc.take(delta) if any(d > 0 for d in delta) else None
        req.blocks = [max(n, h) for n, h in zip(need, req.blocks, strict=True)]
        cached.append((req.req_id, req.num_computed_tokens, new_blocks))
        num_scheduled[req.req_id] = 1 + k
        if k:
            # Draft token values do not matter for compilation; their count does.
            spec_tokens[req.req_id] = [0] * k
    run_step(execute, sample, scheduler_output(cached=cached, num_scheduled=num_scheduled,
                                               spec_tokens=spec_tokens))
    for idx, has_drafts in rows:
        reqs[idx].num_computed_tokens += 1 + (num_spec_steps if has_drafts else 0)
    return sum(num_scheduled.values()), restated


def ran_phase(name: str, seconds: float, num_reqs: int, num_tokens: int, steps: int,
              shapes: dict[str, Any], detail: str) -> PhaseResult:
    logger.debug("warmup phase=%s status=RAN seconds=%.3f num_reqs=%d num_tokens=%d steps=%d",
                 name, seconds, num_reqs, num_tokens, steps)
    return PhaseResult(name=name, status=PhaseStatus.RAN, duration_s=seconds, num_reqs=num_reqs,
                       num_tokens=num_tokens, num_steps=steps, shapes=dict(shapes), detail=detail)


def finish(execute: ExecuteModel, req_ids: Sequence[str]) -> None:
    """Tell the runner the warmup's requests are done, so it frees their state."""
    if req_ids:
        execute(scheduler_output(finished=set(req_ids)))


def synchronize(model_runner: WarmupRunner) -> None:
    """Wait for queued device work, so a timer read afterwards measures it."""
    device = model_runner.device
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


@contextmanager
def synced_timer(model_runner: WarmupRunner) -> Iterator[list[float]]:
    """Yields a one-element list that holds the elapsed seconds once the block exits."""
    synchronize(model_runner)
    box = [0.0]
    start = time.perf_counter()
    try:
        yield box
    finally:
        synchronize(model_runner)
        box[0] = time.perf_counter() - start
