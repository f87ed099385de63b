"""A tiny-model runner with Llama-3.2-1B head shapes, warmed by the real plan on CUDA and its
JitMonitor marked ready: the start of every "serving after warmup compiles nothing" test."""

from __future__ import annotations

from typing import Any

from tests.gpu.test_backends_gpu import SHAPES
from tests.runner_helpers import tiny_config
from warmgate.server.core.results import WarmupReport
from warmgate.server.jit import JitMonitor
from warmgate.server.warmup.plan import load_runner, run_warmup_plan


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
