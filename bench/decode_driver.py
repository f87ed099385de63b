"""A minimal scheduler for benchmarks: prefill N requests once, then time decode steps."""

from __future__ import annotations

import time
from statistics import median

import torch

from warmgate.server.config.runner_config import cdiv
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.runner.scheduler_output import (
    GREEDY,
    CachedRequestData,
    NewRequestData,
    SamplingParams,
    SchedulerOutput,
)


class DecodeDriver:
    def __init__(self, runner: ModelRunner, num_reqs: int, prompt_len: int,
                 max_decode_steps: int, params: SamplingParams = GREEDY,
                 prefix: str = "bench") -> None:
        self.runner = runner
        self.bs = runner.kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size
        per_req = cdiv(prompt_len + max_decode_steps * runner.decode_query_len + 1, self.bs)
        if num_reqs * per_req >= runner.kv_cache_config.num_blocks:
            raise ValueError("not enough KV blocks for the benchmark; raise num_blocks")
        self.ids = [f"{prefix}{i}" for i in range(num_reqs)]
        self.blocks = {r: list(range(1 + i * per_req, 1 + (i + 1) * per_req))
                       for i, r in enumerate(self.ids)}
        self.computed = dict.fromkeys(self.ids, 0)
        self.prompt_len = prompt_len
        self.params = params

    def prefill(self, chunk: int) -> None:
        """Prefill every request, `chunk` requests per step."""
        for start in range(0, len(self.ids), chunk):
            ids = self.ids[start:start + chunk]
            new = [NewRequestData(r, [(7 * i + 3) % 1000 for i in range(self.prompt_len)],
                                  (self.blocks[r],), 0, self.params) for r in ids]
            so = SchedulerOutput(scheduled_new_reqs=new,
                                 num_scheduled_tokens=dict.fromkeys(ids, self.prompt_len),
                                 total_num_scheduled_tokens=len(ids) * self.prompt_len)
            self.runner.execute_model(so)
            self.runner.sample_tokens(None)
            for r in ids:
                self.computed[r] = self.prompt_len

    def decode(self, num_reqs: int) -> float:
        """One decode step of the first num_reqs requests; returns its wall seconds."""
        ids = self.ids[:num_reqs]
        k = self.runner.num_speculative_steps
        cached = CachedRequestData(req_ids=list(ids), new_block_ids=[None] * len(ids),
                                   num_computed_tokens=[self.computed[r] for r in ids])
        so = SchedulerOutput(scheduled_cached_reqs=cached,
                             num_scheduled_tokens=dict.fromkeys(ids, 1 + k),
                             total_num_scheduled_tokens=len(ids) * (1 + k),
                             scheduled_spec_decode_tokens={r: [1] * k for r in ids} if k else {})
        torch.cuda.synchronize()
        start = time.perf_counter()
        self.runner.execute_model(so)
        self.runner.sample_tokens(None)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        for r in ids:
            self.computed[r] += 1
        return seconds

    def median_decode_ms(self, num_reqs: int, steps: int, warmup: int = 3) -> float:
        for _ in range(warmup):
            self.decode(num_reqs)
        return 1000 * median(self.decode(num_reqs) for _ in range(steps))
