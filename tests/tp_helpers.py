"""Shared by the tensor-parallel tests: rank 0's runner in this process (its workers as
subprocesses, gloo on the CPU), and a greedy run that records every step's logits."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from tests.serving_helpers import reference_greedy
from warmgate.server.config.runner_config import ParallelConfig, RunnerConfig
from warmgate.server.distributed.build import build_tensor_parallel_runner
from warmgate.server.distributed.runners import TensorParallelRunner
from warmgate.server.jit import JitMonitor


@contextmanager
def tp_runner(config: RunnerConfig, size: int, jit_monitor: JitMonitor | None = None
              ) -> Iterator[TensorParallelRunner]:
    runner = build_tensor_parallel_runner(
        dataclasses.replace(config, parallel=ParallelConfig(tensor_parallel_size=size)),
        jit_monitor)
    try:
        yield runner
    finally:
        runner.close()


def greedy_with_logits(runner: Any, prompt: Sequence[int], max_tokens: int
                       ) -> tuple[list[int], list[torch.Tensor]]:
    """reference_greedy's tokens, and the logits row of each step (float32)."""
    logits: list[torch.Tensor] = []
    execute = runner.execute_model

    def recording(so: Any) -> Any:
        out = execute(so)
        if runner.last_logits is not None:
            logits.append(runner.last_logits.clone())
        return out

    runner.execute_model = recording
    try:
        return reference_greedy(runner, prompt, max_tokens), logits
    finally:
        del runner.execute_model


def max_logit_gap(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    assert len(a) == len(b) and a, (len(a), len(b))
    assert all(x.shape == y.shape for x, y in zip(a, b, strict=True))
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))
