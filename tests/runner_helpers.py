"""Shared by the runner tests (and by anyone driving a real ModelRunner in a test).

`tiny_config` gives a resolved CPU float32 config small enough for milliseconds per step;
`MiniScheduler` is just enough of a scheduler to drive a runner (devtools' BatchDriver
with a default policy): it hands out blocks, chunks prompts, attaches drafts, and follows the
runner's outputs the way a scheduler does (after a speculative step it counts only the
accepted drafts as computed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from warmgate.server.config.runner_config import (
    CacheConfig,
    DeviceConfig,
    ModelConfig,
    RunnerConfig,
    SchedulerConfig,
    SpeculativeConfig,
    resolve_runner_config,
)
from warmgate.server.devtools.batch_driver import BatchDriver, DrivenRequest, Work
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.runner.scheduler_output import (
    GREEDY,
    ModelRunnerOutput,
    SamplingParams,
    SchedulerOutput,
)
from warmgate.server.serving.block_pool import BlockPool


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


def save_tiny(directory: Path) -> Path:
    """The tiny preset's random weights saved as a model directory (config.json and
    safetensors), untied: the file holds an lm_head.weight of its own."""
    from warmgate.server.runner.weights import save_weights

    runner = make_runner()
    save_weights(runner.model, runner.config.model, directory)
    return directory


def copy_model_dir(saved: Path, target: Path,
                   edit: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """A copy of a saved model directory (config.json, model.safetensors), its config edited
    in place by `edit` first."""
    import json

    target.mkdir(exist_ok=True)
    config = json.loads((saved / "config.json").read_text())
    if edit is not None:
        edit(config)
    (target / "config.json").write_text(json.dumps(config))
    (target / "model.safetensors").write_bytes((saved / "model.safetensors").read_bytes())
    return target


def prompt(n: int, offset: int = 0, vocab: int = 512) -> list[int]:
    """A deterministic prompt of n tokens."""
    return [(offset + 37 * i + 11) % vocab for i in range(n)]


class MiniScheduler:
    """devtools' BatchDriver (blocks, new/cached requests, outputs followed) with a default
    policy: each step, the rest of every prompt, else one decode token plus drafts."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.core = BatchDriver(runner)

    @property
    def reqs(self) -> dict[str, DrivenRequest]:
        return self.core.reqs

    @property
    def free_blocks(self) -> list[int]:
        return self.core.pool.free_ids

    @free_blocks.setter
    def free_blocks(self, blocks: list[int]) -> None:
        """Hand out only these block ids, in this order (before any request holds blocks)."""
        self.core.pool = BlockPool(self.core.pool.num_blocks, blocks)

    def add(self, req_id: str, prompt_token_ids: Sequence[int],
            params: SamplingParams | None = GREEDY) -> None:
        if self.runner.is_pooling_model:
            params = None
        self.core.add(DrivenRequest(req_id, list(prompt_token_ids), params, max_new_tokens=0))

    def finish(self, req_id: str) -> None:
        self.core.finish(req_id)

    def tokens(self, req_id: str) -> list[int]:
        return self.reqs[req_id].output_token_ids

    def plan(self, num_tokens: dict[str, int] | None = None,
             drafts: dict[str, list[int]] | None = None) -> dict[str, Work]:
        """The given requests (default: all): the rest of the prompt, or one decode token
        plus drafts; num_tokens caps a prefill chunk."""
        drafts = drafts or {}
        ids = list(num_tokens) if num_tokens is not None else list(self.reqs)
        plan: dict[str, Work] = {}
        for rid in ids:
            d = tuple(drafts.get(rid, ()))
            remaining = self.reqs[rid].remaining_prompt
            n = (num_tokens or {}).get(rid, remaining if remaining > 0 else 1 + len(d))
            plan[rid] = Work(n, d)
        return plan

    def schedule(self, num_tokens: dict[str, int] | None = None,
                 drafts: dict[str, list[int]] | None = None) -> SchedulerOutput:
        return self.core.build_output(self.plan(num_tokens, drafts))

    def update(self, out: ModelRunnerOutput) -> None:
        self.core.apply_output(out)

    def step(self, num_tokens: dict[str, int] | None = None,
             drafts: dict[str, list[int]] | None = None) -> ModelRunnerOutput | None:
        return self.core.step(self.plan(num_tokens, drafts))

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

    def spy(inputs: Any) -> torch.Tensor:
        flags.append(inputs.meta.is_uniform_decode)
        return original(inputs)

    monkeypatch.setattr(runner, "_run_model", spy)
    return flags


def with_model(config: RunnerConfig, **overrides: Any) -> RunnerConfig:
    return dataclasses.replace(config, model=dataclasses.replace(config.model, **overrides))
