"""The warmup's `moe` phase on tiny random Qwen3-MoE and Mixtral models on the CPU: it runs
(RAN, a launch for every token-count bucket a forward can reach), a dense model skips it
(NOT_MOE, in the proto too), an autotune's winners go into the compile cache entry and a warm
start reads them back timing nothing, and serving after ready autotunes nothing unless a
bucket was left out (then once, counted after ready).

The CPU runs the torch reference, so there is no device to time on: a fake timer stands in
for the runner's CUDA one (runner.moe_tuning.time_launch, exercised by tests/gpu/)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.runner_helpers import prompt, tiny_config
from tests.test_compile_warmup import run_random_batches
from tests.test_moe_launches import FakeTimer
from warmgate.server.cache.moe_launches import MOE_FILE
from warmgate.server.cache.shape_sweeps import ENV_VAR
from warmgate.server.config.moe_kernel import MoELaunch, candidates
from warmgate.server.core.results import PhaseStatus, SkipReason
from warmgate.server.devtools.batch_driver import BatchDriver, DrivenRequest, Work
from warmgate.server.jit import JitMonitor
from warmgate.server.jit.events import AUTOTUNE
from warmgate.server.warmup import load_runner, run_warmup_plan

MODELS = {
    "qwen3_moe": dict(architecture="qwen3_moe", num_experts=8, num_experts_per_tok=2,
                      moe_intermediate_size=32, norm_topk_prob=True),
    "mixtral": dict(architecture="mixtral", num_experts=4, num_experts_per_tok=2,
                    moe_intermediate_size=64, norm_topk_prob=True),
}


@pytest.fixture
def monitor() -> Iterator[JitMonitor]:
    with JitMonitor() as m:
        yield m


def _warm(monitor: JitMonitor, timer: Any = None, **model: Any) -> tuple[Any, Any]:
    """A tiny runner (budget 300 tokens: buckets 2, 32, 256 and 2048) warmed by the whole plan;
    `timer` is attached before the plan, as the runner attaches its own on CUDA."""
    runner, load = load_runner(tiny_config(max_num_batched_tokens=300, max_num_seqs=4,
                                           **model), jit_monitor=monitor)
    if timer is not None:
        runner.model.moe_launches.timer = timer
    report = run_warmup_plan(runner, load_phase=load)
    assert report.succeeded, [p.detail for p in report.phases]
    return runner, report


@pytest.mark.parametrize("arch", list(MODELS))
def test_the_plan_runs_the_moe_phase_with_every_bucket(arch: str, monitor: JitMonitor) -> None:
    runner, report = _warm(monitor, **MODELS[arch])
    names = [p.name for p in report.phases]
    assert names.index("moe") == names.index("flashinfer") + 1 == names.index("compile") - 1
    phase = report.phase("moe")
    assert phase.status is PhaseStatus.RAN
    assert phase.shapes["buckets"] == [2, 32, 256, 2048]
    assert phase.shapes["token_counts"] == [2, 32, 256, 300]
    assert phase.shapes["source"] == "the table" and phase.shapes["autotune_s"] == 0.0
    launches = runner.model.moe_launches
    assert sorted(launches.chosen) == [2, 32, 256, 2048]
    # Decode-sized forwards take the per-slot kernels, larger ones the grouped GEMMs.
    assert [launches.chosen[b].per_slot for b in (2, 32, 256, 2048)] == [True] + [False] * 3
    assert phase.shapes["launches"] == {str(b): str(launch)
                                        for b, launch in launches.chosen.items()}
    # Every layer shares the one table of launches.
    assert all(layer.moe.launches is launches for layer in runner.model.layers)


def test_a_dense_model_skips_the_phase_as_not_moe(monitor: JitMonitor) -> None:
    from warmgate.server.api.convert import phase_to_proto
    from warmgate.v1 import warmup_pb2 as pb

    _, report = _warm(monitor)
    phase = report.phase("moe")
    assert phase.status is PhaseStatus.SKIPPED and phase.skip_reason is SkipReason.NOT_MOE
    assert phase_to_proto(phase).skip_reason == pb.SKIP_REASON_NOT_MOE
    assert report.to_dict()["phases"][2]["skip_reason"] == "NOT_MOE"


class NoTimer:
    def __call__(self, launch: MoELaunch, num_tokens: int) -> float:
        raise AssertionError(f"a warm start timed {launch} at {num_tokens} tokens")


def test_autotuned_launches_are_kept_and_a_warm_start_times_nothing(
        monitor: JitMonitor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, str(tmp_path))  # the entry's shape_sweeps/ (cache/env.py)
    timer = FakeTimer(best_m=64)
    cold, report = _warm(monitor, timer, **MODELS["qwen3_moe"])
    phase = report.phase("moe")
    assert phase.shapes["source"] == "autotune" and phase.shapes["autotune_s"] > 0
    assert {n for _, n in timer.calls} == {2, 32, 256, 300}  # each bucket at its count
    assert phase.compiles == {AUTOTUNE: 4}  # billed to the phase that tuned
    launches = cold.model.moe_launches
    judge = FakeTimer(best_m=64)
    assert launches.chosen == {b: min(candidates(b, launches.shape, 300),
                                      key=lambda c: judge(c, 0)) for b in (2, 32, 256, 2048)}
    assert launches.chosen[2048].block_m == 64
    assert (tmp_path / MOE_FILE).is_file()
    with JitMonitor() as warm_monitor:
        warm, warm_report = _warm(warm_monitor, NoTimer(), **MODELS["qwen3_moe"])
        warm_phase = warm_report.phase("moe")
        assert warm_phase.shapes["source"] == "the compile cache"
        assert warm_phase.shapes["autotune_s"] == 0.0 and warm_phase.compiles == {}
        assert warm.model.moe_launches.chosen == cold.model.moe_launches.chosen


def test_serving_after_ready_autotunes_nothing_unless_a_bucket_was_left_out(
        monitor: JitMonitor) -> None:
    runner, _ = _warm(monitor, FakeTimer(), **MODELS["mixtral"])
    monitor.mark_ready()
    sizes = run_random_batches(runner, monitor, 40)
    assert max(sizes) > 32  # batches landed in more than one bucket
    assert monitor.snapshot().total_after_ready == 0
    # A bucket the warmup did not fill: the next forward in it tunes, and it is counted.
    del runner.model.moe_launches.chosen[256]
    sched = BatchDriver(runner)
    sched.add(DrivenRequest("late", prompt(100), None, 4))
    sched.step({"late": Work(100)})
    sched.step({"late": Work(1)})  # a decode: bucket 2, still filled
    assert monitor.snapshot().after_ready == {AUTOTUNE: 1}


def test_the_compile_phases_moe_sweep_runs_every_eager_count_at_its_buckets_launch(
        monitor: JitMonitor, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep itself (the compile phase runs it on CUDA only, with --shape-sweeps): a MoE
    layer at every token count a forward can run outside a graph, none of them tuning."""
    from warmgate.server.warmup.moe_phase import sweep_moe_tokens

    runner, _ = _warm(monitor, FakeTimer(), **MODELS["qwen3_moe"])
    seen: list[int] = []
    launches = runner.model.moe_launches
    lookup = launches.launch
    monkeypatch.setattr(launches, "launch", lambda n: seen.append(n) or lookup(n))
    before = monitor.snapshot()
    counts = runner.eager_token_counts()
    assert sweep_moe_tokens(runner) == len(counts) > 1
    assert seen == counts  # the first MoE layer once per count
    assert monitor.snapshot().minus(before).compiles == {}
    dense, _ = _warm(monitor)
    assert sweep_moe_tokens(dense) == 0


@pytest.mark.slow
def test_under_torch_compile_a_moe_model_compiles_nothing_after_ready(
        monitor: JitMonitor) -> None:
    """The experts are a graph break (the launch lookup is host state dynamo must not guard
    on): every bucket's halves compile in the compile phase, none after ready."""
    from tests.test_compile_warmup import compiled_config, three_buckets

    runner, load = load_runner(three_buckets(compiled_config(**MODELS["qwen3_moe"])),
                               jit_monitor=monitor)
    report = run_warmup_plan(runner, load_phase=load)
    assert report.succeeded and report.phase("moe").status is PhaseStatus.RAN
    assert runner.compile_buckets == (1, 8, 16)
    assert report.phase("compile").compiles.get("dynamo", 0) > 0
    monitor.mark_ready()
    sizes = run_random_batches(runner, monitor, 60)
    assert len(sizes) >= 8 and monitor.snapshot().total_after_ready == 0
