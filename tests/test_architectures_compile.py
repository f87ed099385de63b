"""torch.compile of the dense half-layers (runner.compiled_forward) with Qwen2's q/k/v biases
and Qwen3's per-head q/k norm: the compiled runner gives the eager runner's logits and
tokens, and a warmed compiled runner compiles nothing for random batches after ready."""

from __future__ import annotations

import pytest

from tests.test_compile_warmup import (
    assert_compiled_matches_eager,
    compiled_config,
    run_random_batches,
    three_buckets,
)
from warmgate.server.config.rope_config import RopeConfig
from warmgate.server.config.runner_config import RunnerConfig, resolve_runner_config
from warmgate.server.jit import JitMonitor
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.warmup import load_runner, run_warmup_plan

pytestmark = pytest.mark.slow
YARN = RopeConfig(rope_type="yarn", theta=1000.0, factor=4.0, original_max_position_embeddings=16)


def _config(architecture: str, compile: bool = True) -> RunnerConfig:
    """The compile tests' configuration, three token buckets (three_buckets): each
    architecture's halves compiled for a single token, a padded batch and the whole
    budget."""
    return three_buckets(compiled_config(compile=compile, architecture=architecture,
                                         rope=YARN))


@pytest.mark.parametrize("architecture", ["qwen2", "qwen3"])
def test_compiled_matches_eager_and_compiles_nothing_after_ready(architecture: str) -> None:
    eager = ModelRunner(resolve_runner_config(_config(architecture, compile=False)))
    with JitMonitor() as monitor:
        compiled, load = load_runner(_config(architecture), jit_monitor=monitor)
        assert run_warmup_plan(compiled, load_phase=load).succeeded
        assert compiled.compile_buckets == (1, 8, 16)
        monitor.mark_ready()
        assert_compiled_matches_eager(compiled, eager)
        run_random_batches(compiled, monitor, 40)
        assert monitor.snapshot().total_after_ready == 0
