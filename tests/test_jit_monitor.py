"""The JIT monitor, strict policy, per-phase ledger and compile buckets, without compiling."""

from __future__ import annotations

import logging

import pytest

from warmgate.server.core.results import PhaseResult, PhaseStatus
from warmgate.server.jit import BatchShape, JitEvent, JitMonitor, StrictJitPolicy
from warmgate.server.jit.events import CUDA_GRAPH_MISS, DYNAMO, INDUCTOR, TRITON
from warmgate.server.runner.compile_buckets import bucket_for, compile_buckets
from warmgate.server.warmup.compile_ledger import PhaseLedger
from warmgate.server.warmup.compile_phase import plan_batches, prompt_layout

SHAPE = BatchShape("mixed", 2, 9, 8)


def test_counts_split_by_kind_readiness_and_cache() -> None:
    monitor = JitMonitor()
    monitor.record(TRITON, name="k", compiled=True)
    monitor.record(TRITON, name="k2", compiled=False)  # loaded from Triton's cache
    monitor.mark_ready()
    monitor.current_batch = SHAPE
    late = monitor.record(DYNAMO, name="frame 0/3 (recompile)")
    monitor.record(INDUCTOR, name="frame 0/3", compiled=False)
    monitor.record(CUDA_GRAPH_MISS, name="9 requests")
    c = monitor.snapshot()
    assert c.compiles == {TRITON: 1, DYNAMO: 1}
    assert c.after_ready == {DYNAMO: 1} and c.total_after_ready == 1
    # Dynamo keeps no cross-process cache: its compiles are not cache misses.
    assert c.cache_hits == {TRITON: 1, INDUCTOR: 1} and c.cache_misses == {TRITON: 1}
    assert (c.graph_misses, c.graph_misses_after_ready) == (1, 1)
    assert late.after_ready and late.batch == SHAPE and late.is_compile
    assert "mixed batch num_reqs=2 num_tokens=9 max_query_len=8" in late.describe()


def test_deltas_and_a_broken_listener() -> None:
    monitor = JitMonitor()
    before = monitor.snapshot()
    seen: list[JitEvent] = []

    def broken(event: JitEvent) -> None:
        raise RuntimeError("listener bug")

    monitor.add_listener(broken)
    monitor.add_listener(seen.append)
    monitor.record(DYNAMO, name="f")  # the broken listener must not break the compile path
    delta = monitor.snapshot().minus(before)
    assert delta.compiles == {DYNAMO: 1} and len(seen) == 1
    assert delta.plus(delta).compiles == {DYNAMO: 2}
    monitor.mark_not_ready()
    assert not monitor.record(DYNAMO, name="f").after_ready


@pytest.mark.parametrize(("mode", "fails", "logs"), [("off", False, False),
                                                    ("warn", False, True),
                                                    ("fail", True, True)])
def test_strict_policy(mode: str, fails: bool, logs: bool,
                       caplog: pytest.LogCaptureFixture) -> None:
    reasons: list[str] = []
    policy = StrictJitPolicy(mode, reasons.append)
    with caplog.at_level(logging.WARNING):
        policy(JitEvent(DYNAMO, compiled=True, after_ready=False, name="before"))
        policy(JitEvent(TRITON, compiled=False, after_ready=True, name="cache load"))
        policy(JitEvent(DYNAMO, compiled=True, after_ready=True, name="frame 1/2",
                        batch=SHAPE))
    assert bool(reasons) is fails
    assert ("num_tokens=9" in caplog.text) is logs and "cache load" not in caplog.text
    if fails:
        assert reasons == [reasons[0]] and "compile after ready: dynamo frame 1/2" in reasons[0]
    with pytest.raises(ValueError, match="off, warn, fail"):
        StrictJitPolicy("loud", reasons.append)


def test_ledger_bills_the_phase_that_was_running() -> None:
    monitor = JitMonitor()
    ledger = PhaseLedger(monitor)
    monitor.record(DYNAMO, name="a")
    monitor.record(INDUCTOR, name="a")
    ledger.charge("compile")
    monitor.record(TRITON, name="k", compiled=False)
    ledger.charge("kernels.prefill")
    ledger.charge("kernels.decode")  # nothing new
    results = {n: PhaseResult(n, PhaseStatus.RAN)
               for n in ("compile", "kernels.prefill", "kernels.decode")}
    for r in results.values():
        ledger.fill(r)
    assert results["compile"].compiles == {DYNAMO: 1, INDUCTOR: 1}
    assert results["compile"].cache_misses == 1
    assert results["kernels.prefill"].compiles == {} and results["kernels.prefill"].cache_hits == 1
    assert results["kernels.decode"].compiles == {}
    PhaseLedger(None).charge("x")  # no monitor (a SimpleNamespace runner): a no-op


def test_buckets_cover_every_token_count() -> None:
    assert compile_buckets((1, 2, 4, 8), 1, 256) == (1, 2, 4, 8, 16, 32, 64, 128, 256)
    # Speculative decode sizes are capture size x (1 + k); the budget is always a bucket.
    assert compile_buckets((1, 2, 4, 8), 4, 100) == (4, 8, 16, 32, 64, 100)
    assert compile_buckets((), 1, 5) == (1, 2, 4, 5)
    buckets = compile_buckets((1, 2), 1, 16)
    assert [bucket_for(buckets, n) for n in (1, 2, 3, 5, 8, 9, 16)] == [1, 2, 4, 8, 8, 16, 16]
    with pytest.raises(ValueError, match="largest compile bucket"):
        bucket_for(buckets, 17)


def test_compile_phase_layouts_respect_every_limit() -> None:
    limits = dict(max_num_seqs=2, max_model_len=10, block_sizes=[4], free_blocks=6)
    assert prompt_layout(7, **limits) == [7]
    assert prompt_layout(15, **limits) == [8, 7]  # two requests: 2 + 2 blocks
    assert prompt_layout(21, **limits) is None  # a third request would be needed
    batches, unreachable = plan_batches((4, 16, 20), **limits)
    assert batches == [(4, [4]), (16, [8, 8]), (20, [10, 10])] and unreachable == []
    batches, unreachable = plan_batches((4, 16, 32), **{**limits, "free_blocks": 3})
    # 16 tokens need 4 blocks, but 5 tokens land in the same bucket with 2; even the 17
    # tokens that would reach bucket 32 need 5 blocks: out of reach.
    assert batches == [(4, [4]), (16, [5])] and unreachable == [32]


def test_compile_and_strict_jit_flags() -> None:
    from warmgate.server.startup import load_server_config

    config = load_server_config(["--device", "cpu"], environ={})
    assert config.strict_jit == "warn" and not config.runner.compilation.compile
    config = load_server_config(["--device", "cpu", "--compile", "--strict-jit", "FAIL"],
                                environ={})
    assert config.strict_jit == "fail" and config.runner.compilation.compile
    env = {"WARMGATE_COMPILE": "true", "WARMGATE_STRICT_JIT": "off"}
    config = load_server_config(["--device", "cpu"], environ=env)
    assert config.strict_jit == "off" and config.runner.compilation.compile
    with pytest.raises(SystemExit):
        load_server_config(["--strict-jit", "loud"], environ={})
