"""Each serving step is counted by kind (decode, mixed, prefill) with the prompt tokens it ran:
the metrics that say how long decoding streams wait behind prompt chunks."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from tests.runner_helpers import make_runner, prompt
from tests.serving_helpers import Served, greedy
from warmgate.server.serving.loop import STEP_KINDS, StepStats
from warmgate.server.telemetry.serving_metrics import ServingMetrics

PROMPT_LENS = (5, 19, 9, 33)


def _stats(**kw: int) -> StepStats:
    return StepStats(seconds=0.01, num_reqs=kw["reqs"], num_tokens=kw["tokens"], num_running=4,
                     num_waiting=0, num_blocks_used=1, num_blocks_usable=8,
                     num_prompt_tokens=kw["prompt"])


def test_a_step_is_decode_mixed_or_prefill_by_its_prompt_tokens() -> None:
    assert _stats(reqs=3, tokens=3, prompt=0).kind == "decode"
    assert _stats(reqs=3, tokens=18, prompt=16).kind == "mixed"
    assert _stats(reqs=2, tokens=16, prompt=16).kind == "prefill"


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_every_prompt_token_is_counted_once_under_the_kind_of_its_step(
        async_scheduling: bool) -> None:
    # A 16-token budget chunks the longer prompts beside the shorter ones' decodes.
    served = Served(make_runner(max_num_batched_tokens=16, max_num_seqs=4),
                    async_scheduling=async_scheduling)
    for i, n in enumerate(PROMPT_LENS):
        served.submit(f"r{i}", prompt(n, offset=i), greedy(6))
    served.run()
    kinds = [s.kind for s in served.stats]
    assert kinds[0] == "prefill"  # nothing decodes yet
    assert {"mixed", "decode"} <= set(kinds)
    registry = CollectorRegistry()
    metrics = ServingMetrics(registry)
    for stats in served.stats:
        metrics.observe_step(stats)
    for kind in STEP_KINDS:
        count = registry.get_sample_value("warmgate_step_duration_seconds_count",
                                          {"kind": kind})
        assert count == kinds.count(kind), kind
    prompt_tokens = {kind: registry.get_sample_value("warmgate_step_prompt_tokens_total",
                                                     {"kind": kind}) for kind in STEP_KINDS}
    assert prompt_tokens["decode"] == 0
    assert prompt_tokens["mixed"] > 0
    assert prompt_tokens["mixed"] + prompt_tokens["prefill"] == sum(PROMPT_LENS)
    assert served.scheduler.num_preemptions == 0  # no recompute in that sum


def test_the_bench_reads_each_kinds_steps_between_two_scrapes() -> None:
    """bench/lib/step_kinds.py on the exposition format itself: what ran between the scrapes,
    each kind's mean and its prompt tokens a step."""
    from prometheus_client import generate_latest

    from tests.bench_harness import load_script

    kinds = load_script("bench/lib/step_kinds.py")
    registry = CollectorRegistry()
    metrics = ServingMetrics(registry)
    metrics.observe_step(_stats(reqs=2, tokens=64, prompt=64))  # before the first scrape
    before = kinds.step_totals(generate_latest(registry).decode())
    for seconds, prompt_tokens in ((0.010, 0), (0.012, 0), (0.030, 500), (0.050, 700)):
        metrics.observe_step(StepStats(seconds, 4, 4 + prompt_tokens, 4, 0, 1, 8,
                                       num_prompt_tokens=prompt_tokens))
    delta = kinds.between(before, kinds.step_totals(generate_latest(registry).decode()))
    assert delta["decode"].steps == 2 and delta["mixed"].steps == 2
    assert delta["prefill"].steps == 0
    assert delta["mixed"].seconds == pytest.approx(0.080)
    assert delta["mixed"].prompt_tokens == 1200
    assert kinds.describe(delta) == ("steps: decode 2 (mean 11.00 ms); mixed 2 (mean 40.00 ms, "
                                     "600 prompt tokens each)")
