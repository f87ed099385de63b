"""Shared by the runner tests (and by anyone driving a real ModelRunner in a test).

`tiny_config` gives a resolved CPU float32 config small enough for milliseconds per step;
`MiniScheduler` is just enough of a scheduler to drive a runner: it hands out blocks, chunks
prompts, attaches drafts, and follows the runner's outputs the way a scheduler does (after a
speculative step it counts only the accepted drafts as computed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from warmgate.server.config import (
    CacheConfig,
    DeviceConfig,
    ModelConfig,
    RunnerConfig,
    SchedulerConfig,
    SpeculativeConfig,
    cdiv,
    resolve_runner_config,
)
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.runner.scheduler_output import (
    GREEDY,
    CachedRequestData,
    ModelRunnerOutput,
    NewRequestData,
    SamplingParams,
    SchedulerOutput,
)


def tiny_config(*, num_spec: int = 0, pooling: bool = False, max_num_seqs: int = 8,
                max_num_batched_tokens: int = 128, block_size: int = 4,
                num_blocks: int | None = 128, max_model_len: int = 128, device: str = "cpu",
                dtype: str = "float32", attention_backend: str = "torch",
                **model_overrides: Any) -> RunnerConfig:
    """The tiny preset, shortened, with small blocks so sequences span several of them."""
    model = ModelConfig.from_preset("tiny", max_model_len=max_model_len,
                                    is_pooling_model=pooling, **model_overrides)
    config = RunnerConfig(
        model=model,
        cache=CacheConfig(block_size=block_size, num_blocks=num_blocks),
        scheduler=SchedulerConfig(max_num_seqs=max_num_seqs,
                                  max_num_batched_tokens=max_num_batched_tokens),
        speculative=SpeculativeConfig(num_speculative_steps=num_spec),
        device=DeviceConfig(device=device, dtype=dtype, attention_backend=attention_backend))
    return resolve_runner_config(config, cuda_available=device.startswith("cuda"))


def make_runner(**kwargs: Any) -> ModelRunner:
    return ModelRunner(tiny_config(**kwargs))


def prompt(n: int, offset: int = 0, vocab: int = 512) -> list[int]:
    """A deterministic prompt of n tokens."""
    return [(offset + 37 * i + 11) % vocab for i in range(n)]


@dataclass
class _Req:
    req_id: str
    prompt_token_ids: list[int]
    params: SamplingParams | None
    blocks: list[int] = field(default_factory=list)
    num_computed: int = 0
    output: list[int] = field(default_factory=list)
    sent: bool = False
    last_scheduled: int = 0
    last_drafts: int = 0


class MiniScheduler:
    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.block_size = runner.kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size
        self.free_blocks = list(range(1, runner.kv_cache_config.num_blocks))  # 0 is null
        self.reqs: dict[str, _Req] = {}
        self._finished: set[str] = set()

    def add(self, req_id: str, prompt_token_ids: Sequence[int],
            params: SamplingParams | None = GREEDY) -> None:
        if self.runner.is_pooling_model:
            params = None
        self.reqs[req_id] = _Req(req_id, list(prompt_token_ids), params)

    def finish(self, req_id: str) -> None:
        req = self.reqs.pop(req_id)
        self.free_blocks.extend(req.blocks)
        self._finished.add(req_id)

    def tokens(self, req_id: str) -> list[int]:
        return self.reqs[req_id].output

    def schedule(self, num_tokens: dict[str, int] | None = None,
                 drafts: dict[str, list[int]] | None = None) -> SchedulerOutput:
        """Schedule the given requests (default: all): the rest of the prompt, or one decode
        token plus drafts; num_tokens caps a prefill chunk."""
        drafts = drafts or {}
        ids = list(num_tokens) if num_tokens is not None else list(self.reqs)
        new, cached = [], CachedRequestData()
        scheduled: dict[str, int] = {}
        for rid in ids:
            req = self.reqs[rid]
            k = len(drafts.get(rid, []))
            remaining = len(req.prompt_token_ids) - req.num_computed
            default = remaining if remaining > 0 else 1 + k
            n = (num_tokens or {}).get(rid, default)
            need = cdiv(req.num_computed + n, self.block_size) - len(req.blocks)
            fresh = [self.free_blocks.pop(0) for _ in range(max(0, need))]
            req.blocks += fresh
            if not req.sent:
                new.append(NewRequestData(rid, list(req.prompt_token_ids), (list(req.blocks),),
                                          req.num_computed, req.params))
                req.sent = True
            else:
                cached.req_ids.append(rid)
                cached.new_block_ids.append((fresh,) if fresh else None)
                cached.num_computed_tokens.append(req.num_computed)
            scheduled[rid] = n
            req.last_scheduled, req.last_drafts = n, k
        so = SchedulerOutput(scheduled_new_reqs=new, scheduled_cached_reqs=cached,
                             num_scheduled_tokens=scheduled,
                             total_num_scheduled_tokens=sum(scheduled.values()),
                             scheduled_spec_decode_tokens={r: list(d) for r, d in drafts.items()},
                             finished_req_ids=self._finished)
        self._finished = set()
        return so

    def update(self, out: ModelRunnerOutput) -> None:
        for rid, toks in zip(out.req_ids, out.sampled_token_ids, strict=True):
            req = self.reqs[rid]
            if toks:
                # Only the accepted drafts entered the cache for good; the last token did not.
                accepted = len(toks) - 1
                req.num_computed += req.last_scheduled - req.last_drafts + accepted
                req.output += toks
            else:
                req.num_computed += req.last_scheduled

    def step(self, num_tokens: dict[str, int] | None = None,
             drafts: dict[str, list[int]] | None = None) -> ModelRunnerOutput | None:
        so = self.schedule(num_tokens, drafts)
        out = self.runner.execute_model(so)
        if out is None:
            out = self.runner.sample_tokens(None)
        if out is not None:
            self.update(out)
        return out

    def logits_of(self, req_id: str) -> torch.Tensor:
        """The last step's logits rows of one request, [rows, V]."""
        logits = self.runner.last_logits
        if logits is None:
            raise AssertionError("the last step produced no logits")
        rows = [i for i, r in enumerate(self.runner.last_logits_req_ids) if r == req_id]
        return logits[rows]


def full_prefill_logits(runner: ModelRunner, tokens: Sequence[int]) -> torch.Tensor:
    """Last-row logits [V] of one whole-sequence prefill, on a scratch request."""
    sched = MiniScheduler(runner)
    # Stay clear of blocks other schedulers on this runner hand out from the bottom.
    sched.free_blocks = sched.free_blocks[::-1]
    rid = f"_full_{len(runner.input_batch.requests)}_{len(tokens)}"
    sched.add(rid, tokens)
    sched.step()
    logits = sched.logits_of(rid)[-1].clone()
    sched.finish(rid)
    runner.execute_model(sched.schedule(num_tokens={}))  # drop the scratch request
    return logits


def record_uniform_flags(runner: ModelRunner, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Spy on the runner's forward hook (until the test ends): appends meta.is_uniform_decode
    for every step."""
    flags: list[bool] = []
    original = runner._run_model

    def spy(input_ids: torch.Tensor, positions: torch.Tensor, meta: Any) -> torch.Tensor:
        flags.append(meta.is_uniform_decode)
        return original(input_ids, positions, meta)

    monkeypatch.setattr(runner, "_run_model", spy)
    return flags


def with_model(config: RunnerConfig, **overrides: Any) -> RunnerConfig:
    return dataclasses.replace(config, model=dataclasses.replace(config.model, **overrides))
