"""A tiny-model runner with Llama-3.2-1B head shapes, warmed by the real plan on CUDA and its
JitMonitor marked ready: the start of every "serving after warmup compiles nothing" test; and
the tiny CUDA configuration the graph and start-up tests build their runners from."""

from __future__ import annotations

import dataclasses
from typing import Any

from tests.gpu.test_backends_gpu import SHAPES
from tests.runner_helpers import tiny_config
from warmgate.server.config.runner_config import RunnerConfig
from warmgate.server.core.results import WarmupReport
from warmgate.server.jit import JitMonitor
from warmgate.server.warmup.plan import load_runner, run_warmup_plan


def tiny_cuda_config(backend: str, num_spec: int, sizes: tuple[int, ...] | None = None,
                     num_blocks: int = 256) -> RunnerConfig:
    """bf16 on CUDA, 8 requests, 256 tokens; `sizes`: the CUDA-graph capture sizes (default:
    the resolved ones). head_dim 64: FlashInfer's SM90 prefill has no kernel for the tiny
    preset's 16."""
    cfg = tiny_config(device="cuda", dtype="bfloat16", attention_backend=backend,
                      num_spec=num_spec, block_size=16, num_blocks=num_blocks,
                      max_model_len=256, max_num_seqs=8, max_num_batched_tokens=256,
                      hidden_size=256, head_dim=64)
    if sizes is None:
        return cfg
    return dataclasses.replace(cfg, compilation=dataclasses.replace(
        cfg.compilation, cuda_graph_sizes=sizes))


def warmed_cuda_runner(backend: str, num_spec: int) -> tuple[Any, JitMonitor, WarmupReport]:
    config = tiny_config(device="cuda", dtype="bfloat16", attention_backend=backend,
                         num_spec=num_spec, max_num_seqs=8, max_num_batched_tokens=128,
                         block_size=16, num_blocks=128, max_model_len=256, **SHAPES)
    monitor = JitMonitor()
    runner, load_phase = load_runner(config, jit_monitor=monitor)
    report = run_warmup_plan(runner, load_phase=load_phase)
    assert report.succeeded, report.to_dict()
    monitor.mark_ready()
    return runner, monitor, report
