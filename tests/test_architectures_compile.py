"""torch.compile of the dense half-layers (runner.compiled_forward) with Qwen2's q/k/v biases
and Qwen3's per-head q/k norm: the compiled runner gives the eager runner's logits and
tokens, and a warmed compiled runner compiles nothing for random batches after ready."""

from __future__ import annotations

import random

import pytest
import torch

from bench.coverage_scheduler import CoverageScheduler
from bench.random_batches import BatchDrawer, Limits
from tests.runner_helpers import MiniScheduler, prompt
from warmgate.server.config import (
    CompilationConfig,
    ModelConfig,
    RunnerConfig,
    SchedulerConfig,
    resolve_runner_config,
)
from warmgate.server.jit import JitMonitor
from warmgate.server.rope_config import RopeConfig
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.warmup import load_runner, run_warmup_plan

pytestmark = pytest.mark.slow
YARN = RopeConfig(rope_type="yarn", theta=1000.0, factor=4.0, original_max_position_embeddings=16)


def _config(architecture: str, compile: bool = True) -> RunnerConfig:
    model = ModelConfig.from_preset("tiny", max_model_len=128, architecture=architecture,
                                    rope=YARN)
    return RunnerConfig(model=model,
                        scheduler=SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=16),
                        compilation=CompilationConfig(compile=compile))


@pytest.mark.parametrize("architecture", ["qwen2", "qwen3"])
def test_compiled_matches_eager_and_compiles_nothing_after_ready(architecture: str) -> None:
    eager = ModelRunner(resolve_runner_config(_config(architecture, compile=False)))
    with JitMonitor() as monitor:
        compiled, load = load_runner(_config(architecture), jit_monitor=monitor)
        assert run_warmup_plan(compiled, load_phase=load).succeeded
        monitor.mark_ready()
        scheds = [MiniScheduler(compiled), MiniScheduler(eager)]
        for s in scheds:  # a 13-token prefill (bucket 16) beside a 3-token one, then decodes
            s.add("a", prompt(13))
            s.add("b", prompt(3, 5))
        for _ in range(3):
            for s in scheds:
                s.step()
            torch.testing.assert_close(compiled.last_logits, eager.last_logits,
                                       rtol=1e-4, atol=1e-4)
        assert scheds[0].tokens("a") == scheds[1].tokens("a")
        for s in scheds:  # drop both requests before the random batches
            s.finish("a")
            s.finish("b")
            s.runner.execute_model(s.schedule(num_tokens={}))
        cfg = compiled.config
        sched = CoverageScheduler(compiled)
        drawer = BatchDrawer(sched, Limits(cfg.scheduler.max_num_seqs,
                                           cfg.scheduler.max_num_batched_tokens,
                                           cfg.model.max_model_len, 0, cfg.model.vocab_size),
                             random.Random(1))
        for _ in range(40):
            sched.step(drawer.next_plan()[1])
        assert monitor.snapshot().total_after_ready == 0
