"""torch.compile on the CPU (inductor, C++): the compile phase compiles every token bucket,
random batches after ready compile nothing, and a bucket the warmup skipped is caught.

All tests share one small configuration (5 buckets: 1, 2, 4, 8, 16), so after the first one
inductor's FX-graph cache turns the others' compiles into loads; dynamo still traces, and
that is what the observers count.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tests.runner_helpers import MiniScheduler, prompt
from warmgate.server.config.runner_config import (
    CompilationConfig,
    ModelConfig,
    RunnerConfig,
    SchedulerConfig,
    resolve_runner_config,
)
from warmgate.server.devtools.batch_driver import BatchDriver, DrivenRequest, Work
from warmgate.server.devtools.random_batches import BatchDrawer, Limits
from warmgate.server.jit import JitEvent, JitMonitor
from warmgate.server.jit.events import DYNAMO
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.warmup import PhaseStatus, compile_phase, load_runner, run_warmup_plan

pytestmark = pytest.mark.slow

BUCKETS = (1, 2, 4, 8, 16)


def compiled_config(compile: bool = True, **model: Any) -> RunnerConfig:
    """The tiny preset (with `model` overrides) under torch.compile, buckets up to 16."""
    return RunnerConfig(model=ModelConfig.from_preset("tiny", max_model_len=128, **model),
                        scheduler=SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=16),
                        compilation=CompilationConfig(compile=compile))


def three_buckets(config: RunnerConfig) -> RunnerConfig:
    """`config` with three token buckets, 1, 8 and 16 (what capture sizes 1 and 8 give; no
    graph is captured on the CPU), instead of its five: the halves still compile for a single
    token, a padded batch and the whole budget, and assert_compiled_matches_eager reaches the
    first and the last. For the tests of one model's compiled path: that every bucket of the
    default list compiles is this file's, and elsewhere each bucket was a cold compile of its
    own."""
    return dataclasses.replace(config, compilation=dataclasses.replace(
        config.compilation, cuda_graph_sizes=(1, 8)))


def run_random_batches(runner: ModelRunner, monitor: JitMonitor, steps: int) -> set[int]:
    """Drive `steps` random batches (seeded) through `runner`; the token counts seen."""
    cfg = runner.config
    sched = BatchDriver(runner)
    drawer = BatchDrawer(sched, Limits(cfg.scheduler.max_num_seqs,
                                       cfg.scheduler.max_num_batched_tokens,
                                       cfg.model.max_model_len, 0, cfg.model.vocab_size),
                         random.Random(1))
    sizes = set()
    for _ in range(steps):
        sched.step(drawer.next_plan()[1])
        sizes.add(monitor.current_batch.num_tokens)
    return sizes


def assert_compiled_matches_eager(compiled: ModelRunner, eager: ModelRunner) -> None:
    """A 13-token prefill (bucket 16) beside a 3-token one, then decodes: the same logits
    and tokens; both requests are dropped at the end."""
    scheds = [MiniScheduler(compiled), MiniScheduler(eager)]
    for s in scheds:
        s.add("a", prompt(13))
        s.add("b", prompt(3, 5))
    for _ in range(3):
        for s in scheds:
            s.step()
        torch.testing.assert_close(compiled.last_logits, eager.last_logits,
                                   rtol=1e-4, atol=1e-4)
    assert scheds[0].tokens("a") == scheds[1].tokens("a")
    for s in scheds:
        s.finish("a")
        s.finish("b")
        s.runner.execute_model(s.schedule(num_tokens={}))


@pytest.fixture
def monitor() -> Iterator[JitMonitor]:
    with JitMonitor() as m:  # uninstalls the dynamo hook at the end
        yield m


def _warm(monitor: JitMonitor) -> tuple[Any, Any]:
    runner, load = load_runner(compiled_config(), jit_monitor=monitor)
    report = run_warmup_plan(runner, load_phase=load)
    assert report.succeeded
    monitor.mark_ready()
    return runner, report


def test_the_compile_phase_compiles_every_bucket_and_nothing_compiles_later(
        monitor: JitMonitor) -> None:
    runner, report = _warm(monitor)
    assert runner.compile_buckets == BUCKETS
    phase = report.phase("compile")
    assert phase.status is PhaseStatus.RAN and phase.shapes["buckets"] == list(BUCKETS)
    # Two compiled functions (the halves around attention) per bucket, shared by the layers.
    assert phase.compiles[DYNAMO] == 2 * len(BUCKETS)
    assert all(p.compiles == {} for p in report.phases if p.name != "compile")
    sizes = run_random_batches(runner, monitor, 150)
    assert len(sizes) >= 10  # the random batches really cover the token range
    assert monitor.snapshot().total_after_ready == 0


def test_compiled_logits_match_the_eager_runner() -> None:
    compiled = ModelRunner(resolve_runner_config(compiled_config()))
    eager = ModelRunner(resolve_runner_config(compiled_config(compile=False)))
    assert_compiled_matches_eager(compiled, eager)


def test_a_bucket_the_warmup_missed_is_counted_after_ready_with_its_batch(
        monitor: JitMonitor, monkeypatch: pytest.MonkeyPatch) -> None:
    # Bucket 8 is touched by no other phase (prefill and sampler: 4 tokens, decode: 1-2,
    # mixed: 2 and 16), so leaving it out of the compile phase leaves it cold.
    monkeypatch.setattr(compile_phase, "buckets_to_warm",
                        lambda runner: tuple(b for b in runner.compile_buckets if b != 8))
    runner, report = _warm(monitor)
    assert report.phase("compile").shapes["buckets"] == [1, 2, 4, 16]
    assert monitor.snapshot().total_after_ready == 0
    late: list[JitEvent] = []
    monitor.add_listener(late.append)
    sched = BatchDriver(runner)
    sched.add(DrivenRequest("r", prompt(7), None, 4))
    sched.step({"r": Work(7)})  # 7 tokens pad to bucket 8
    counts = monitor.snapshot()
    assert counts.after_ready == {DYNAMO: 2}  # both halves of the layer
    assert {e.batch.num_tokens for e in late if e.after_ready} == {7}
    assert all(e.batch.kind == "prefill" for e in late)
    sched.step({"r": Work(1)})
    assert monitor.snapshot().total_after_ready == 2  # a decode (bucket 1) was warmed
