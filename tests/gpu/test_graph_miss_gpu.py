"""A real CUDA-graph miss on the GPU (issue 16 item 9): graphs captured for batches of 1 and
2 requests only, then a uniform decode of 4 after ready finds none, runs eagerly, and is
counted after ready (monitor and metric); --strict-jit=fail treats it like a compile. With
graphs for every size, the same batch replays and nothing is counted."""

from __future__ import annotations

import pytest

from tests.gpu.warmed import tiny_cuda_config
from tests.runner_helpers import MiniScheduler, prompt
from warmgate.server.jit import StrictJitPolicy
from warmgate.server.runner.attention import backend_available
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.telemetry.metrics import Metrics
from warmgate.server.warmup import run_warmup_plan

pytestmark = pytest.mark.gpu


def _warm_runner(backend: str, num_spec: int, sizes: tuple[int, ...] | None) -> ModelRunner:
    runner = ModelRunner(tiny_cuda_config(backend, num_spec, sizes))
    report = run_warmup_plan(runner)
    assert report.succeeded, [p.detail for p in report.phases]
    assert runner.cuda_graphs_captured
    return runner


def _decode(runner: ModelRunner, num_reqs: int, num_spec: int, tag: str) -> None:
    """Prefill num_reqs requests, then two uniform decode steps over all of them."""
    sched = MiniScheduler(runner)
    for i in range(num_reqs):
        sched.add(f"{tag}{i}", prompt(7, offset=i))
    sched.step()
    for _ in range(2):
        drafts = {f"{tag}{i}": [3] * num_spec for i in range(num_reqs)} if num_spec else None
        sched.step(drafts=drafts)
    for i in range(num_reqs):
        sched.finish(f"{tag}{i}")


@pytest.mark.parametrize("backend", ["torch", "triton", "flashinfer"])
@pytest.mark.parametrize("num_spec", [0, 3])
def test_a_batch_above_the_captured_sizes_misses_after_ready(backend: str,
                                                             num_spec: int) -> None:
    if not backend_available(backend):
        pytest.skip(f"{backend} is not installed")
    runner = _warm_runner(backend, num_spec, sizes=(1, 2))
    assert runner.graph_runner is not None and sorted(runner.graph_runner.graphs) == [1, 2]
    monitor = runner.jit_monitor
    metrics = Metrics()
    monitor.add_listener(metrics.observe_jit)
    reasons: list[str] = []
    monitor.add_listener(StrictJitPolicy("fail", reasons.append))
    monitor.mark_ready()
    replays = runner.graph_runner.num_replays
    _decode(runner, 2, num_spec, "fits")
    assert runner.graph_runner.num_replays == replays + 2
    assert monitor.snapshot().graph_misses_after_ready == 0 and reasons == []
    _decode(runner, 4, num_spec, "big")
    assert monitor.snapshot().graph_misses_after_ready == 2  # both decode steps
    assert metrics.graph_misses.labels(after_ready="true", rank="0")._value.get() == 2
    assert reasons and "CUDA-graph miss after ready" in reasons[0]


@pytest.mark.parametrize("num_spec", [0, 3])
def test_default_capture_sizes_leave_no_miss(num_spec: int) -> None:
    runner = _warm_runner("torch", num_spec, sizes=None)
    runner.jit_monitor.mark_ready()
    for n in (1, 3, 4, 8):
        _decode(runner, n, num_spec, f"n{n}_")
    assert runner.jit_monitor.snapshot().graph_misses_after_ready == 0
