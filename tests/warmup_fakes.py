"""SimpleNamespace runners and recording callbacks, as vLLM's own warmup tests use."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from warmgate.server.runner.scheduler_output import SchedulerOutput


def fake_runner(*, num_spec: int = 0, max_num_seqs: int = 8, max_num_batched_tokens: int = 256,
                num_blocks: int = 1000, block_size: int = 16,
                is_pooling: bool = False, max_model_len: int = 2048) -> SimpleNamespace:
    spec = SimpleNamespace(block_size=block_size)
    return SimpleNamespace(
        device=torch.device("cpu"),  # the timers synchronize only a CUDA device
        num_speculative_steps=num_spec,
        decode_query_len=1 + num_spec,
        max_num_reqs=max_num_seqs,
        max_model_len=max_model_len,
        is_pooling_model=is_pooling,
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs,
                                         max_num_batched_tokens=max_num_batched_tokens),
        kv_cache_config=SimpleNamespace(
            num_blocks=num_blocks, kv_cache_groups=[SimpleNamespace(kv_cache_spec=spec)]),
    )


class Recorder:
    """Records every scheduler output and sample call, in order."""

    def __init__(self) -> None:
        self.steps: list[SchedulerOutput] = []
        self.samples = 0

    def execute(self, so: SchedulerOutput) -> None:
        self.steps.append(so)

    def sample(self, grammar: Any) -> None:
        self.samples += 1

    @property
    def work_steps(self) -> list[SchedulerOutput]:
        """Steps that schedule tokens (not the clean-up steps that only finish requests)."""
        return [s for s in self.steps if s.total_num_scheduled_tokens > 0]


def fail_execute(so: SchedulerOutput) -> None:
    raise AssertionError("worker_execute_model must not be called by a skipped warmup")


def fail_sample(grammar: Any) -> None:
    raise AssertionError("worker_sample_tokens must not be called by a skipped warmup")


def query_lens(so: SchedulerOutput) -> tuple[list[int], list[bool]]:
    """Per request: tokens scheduled, and whether it is new (reading its prompt)."""
    new_ids = {r.req_id for r in so.scheduled_new_reqs}
    ids = [r.req_id for r in so.scheduled_new_reqs] + so.scheduled_cached_reqs.req_ids
    return [so.num_scheduled_tokens[i] for i in ids], [i in new_ids for i in ids]
