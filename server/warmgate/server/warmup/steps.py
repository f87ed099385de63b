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

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from warmgate.server.runner.scheduler_output import (
    CachedRequestData,
    GrammarOutput,
    ModelRunnerOutput,
    NewRequestData,
    SamplingParams,
    SchedulerOutput,
)
from warmgate.server.warmup.runner_contract import WarmupRunner
from warmgate.server.warmup.shapes import blocks_for

__all__ = ["BlockAllocator", "WarmupRequest", "blocks_for", "finish", "kv_block_sizes",
           "new_request", "run_step", "scheduler_output", "synced_timer"]

# The two callbacks warmup drives the runner through (WarmupRunner.execute_model and
# .sample_tokens, or a pipeline-parallel worker's equivalents).
ExecuteModel = Callable[[SchedulerOutput], ModelRunnerOutput | None]
SampleTokens = Callable[[GrammarOutput | None], ModelRunnerOutput | None]


def kv_block_sizes(model_runner: WarmupRunner) -> list[int]:
    return [g.kv_cache_spec.block_size for g in model_runner.kv_cache_config.kv_cache_groups]


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
