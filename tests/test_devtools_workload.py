"""devtools.workload and devtools.load_stats, the load benches' pure parts: distributions (and
their error messages), the seeded workload, percentiles and the summary's arithmetic. Pure
Python: no server, no torch."""

from __future__ import annotations

import itertools
import math
import random
import statistics
from typing import Any

import pytest

from warmgate.server.devtools.load_stats import (
    RequestResult,
    Stats,
    format_table,
    percentile,
    summarize,
)
from warmgate.server.devtools.workload import (
    Distribution,
    RequestSpec,
    build_workload,
    make_prompt,
    parse_distribution,
    parse_rate,
    poisson_arrivals,
)

# -- parsing --------------------------------------------------------------------------------


def test_parse_each_kind() -> None:
    assert parse_distribution("fixed:128") == Distribution("fixed", (128.0,), "fixed:128")
    assert parse_distribution("uniform:16:256").params == (16.0, 256.0)
    normal = parse_distribution(" Normal:128:32.5 ")
    assert (normal.kind, normal.params, str(normal)) == ("normal", (128.0, 32.5),
                                                         "Normal:128:32.5")


@pytest.mark.parametrize(("text", "message"), [
    ("poisson:3", "unknown distribution 'poisson'"),
    ("128", "unknown distribution '128'"),
    ("", "unknown distribution ''"),
    ("fixed", "fixed takes 1 value (fixed:N), got 0"),
    ("fixed:1:2", "fixed takes 1 value (fixed:N), got 2"),
    ("uniform:5", "uniform takes 2 values (uniform:LO:HI), got 1"),
    ("normal:1:2:3", "normal takes 2 values (normal:MEAN:STD), got 3"),
    ("fixed:12.5", "fixed:N takes integers"),
    ("uniform:a:9", "uniform:LO:HI takes integers"),
    ("fixed:0", "lengths must be >= 1"),
    ("uniform:0:4", "lengths must be >= 1"),
    ("uniform:9:4", "LO (9) is above HI (4)"),
    ("normal:x:1", "normal:MEAN:STD takes numbers"),
    ("normal:10:-1", "STD must be >= 0"),
    ("normal:0.5:1", "MEAN must be >= 1"),
    ("normal:nan:1", "MEAN and STD must be finite"),
    ("normal:10:inf", "MEAN and STD must be finite"),
])
def test_parse_errors_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_distribution(text)
    assert message in str(info.value)
    assert repr(text) in str(info.value)  # the bad input is quoted back


def test_parse_rate() -> None:
    assert parse_rate("2.5") == 2.5
    assert math.isinf(parse_rate("inf"))
    for bad in ("0", "-1", "nan", "fast"):
        with pytest.raises(ValueError, match=repr(bad)):
            parse_rate(bad)


# -- sampling -------------------------------------------------------------------------------


def test_samples_stay_in_range_and_clamp_to_one() -> None:
    rng = random.Random(1)
    assert {parse_distribution("fixed:7").sample(rng) for _ in range(20)} == {7}
    uniform = [parse_distribution("uniform:3:6").sample(rng) for _ in range(2000)]
    assert set(uniform) == {3, 4, 5, 6}  # both ends included
    # Mean 1, std 50: about half the draws land below 1 and must clamp to exactly 1.
    wide = [parse_distribution("normal:1:50").sample(rng) for _ in range(2000)]
    assert min(wide) == 1
    assert 0.4 < wide.count(1) / len(wide) < 0.6
    narrow = [parse_distribution("normal:100:5").sample(rng) for _ in range(4000)]
    assert abs(statistics.fmean(narrow) - 100) < 0.5
    assert 4.5 < statistics.pstdev(narrow) < 5.5
    assert all(isinstance(v, int) for v in narrow)


def test_distribution_mean() -> None:
    assert parse_distribution("uniform:16:256").mean == 136
    assert parse_distribution("normal:128:32").mean == 128


def test_poisson_arrivals() -> None:
    assert poisson_arrivals(4, math.inf, random.Random(0)) == [0.0] * 4
    times = poisson_arrivals(20000, 50.0, random.Random(0))
    assert times[0] == 0.0
    assert times == sorted(times)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert abs(statistics.fmean(gaps) - 1 / 50) < 0.001  # exponential gaps of mean 1/rate
    # Exponential: the std equals the mean (a fixed-interval schedule would have std 0).
    assert abs(statistics.pstdev(gaps) - 1 / 50) < 0.002


def test_repetitive_prompt_repeats_a_short_motif() -> None:
    prompt = make_prompt(40, 512, random.Random(3), repetitive=True)
    assert len(prompt) == 40
    period = next(p for p in range(1, 41) if all(prompt[i] == prompt[i % p]
                                                  for i in range(40)))
    assert 2 <= period <= 8
    assert make_prompt(1, 512, random.Random(3), repetitive=True) != []
    plain = make_prompt(200, 512, random.Random(3), repetitive=False)
    assert len(set(plain)) > 100 and all(0 <= t < 512 for t in plain)


# -- the workload ---------------------------------------------------------------------------

def _workload(**overrides: object) -> list[RequestSpec]:
    kwargs: dict[str, Any] = dict(rate=10.0, prompt_len=parse_distribution("uniform:4:64"),
                        output_len=parse_distribution("normal:32:8"), vocab=100, seed=7)
    kwargs.update(overrides)
    return build_workload(kwargs.pop("num_requests", 30), **kwargs)


def test_workload_is_reproducible_and_seed_dependent() -> None:
    first, again = _workload(), _workload()
    assert first == again
    other = _workload(seed=8)
    assert [s.prompt_token_ids for s in first] != [s.prompt_token_ids for s in other]
    assert [s.seed for s in first] != [s.seed for s in other]
    assert len({s.seed for s in first}) == len(first)  # per-request seeds differ
    assert all(0 <= t < 100 for s in first for t in s.prompt_token_ids)
    assert [s.index for s in first] == list(range(30))


def test_a_request_does_not_depend_on_the_other_knobs() -> None:
    """Request i is the same whatever the rate or the number of requests."""
    base = _workload()
    faster = _workload(rate=math.inf, num_requests=40)
    assert [(s.prompt_token_ids, s.max_tokens, s.seed) for s in base] == \
           [(s.prompt_token_ids, s.max_tokens, s.seed) for s in faster[:30]]
    assert all(s.arrival_s == 0 for s in faster)
    assert base[0].arrival_s == 0 and base[-1].arrival_s > 0


def test_workload_fits_max_model_len() -> None:
    specs = _workload(prompt_len=parse_distribution("fixed:100"),
                      output_len=parse_distribution("fixed:50"), max_model_len=120)
    assert {len(s.prompt_token_ids) for s in specs} == {100}
    assert {s.max_tokens for s in specs} == {20}
    long = _workload(prompt_len=parse_distribution("fixed:500"), max_model_len=64)
    assert {len(s.prompt_token_ids) for s in long} == {63}
    assert {s.max_tokens for s in long} == {1}
    with pytest.raises(ValueError, match="max_model_len"):
        _workload(max_model_len=1)
    with pytest.raises(ValueError, match="vocab"):
        _workload(vocab=0)


# -- percentiles ----------------------------------------------------------------------------

def test_percentile_interpolates_like_numpy() -> None:
    values = [15.0, 20.0, 35.0, 40.0, 50.0]
    assert percentile(values, 0) == 15
    assert percentile(values, 100) == 50
    assert percentile(values, 50) == 35
    assert percentile(values, 40) == pytest.approx(29.0)  # rank 1.6: 20 + 0.6 * 15
    assert percentile(reversed(values), 90) == pytest.approx(46.0)  # order does not matter
    assert percentile([3.0], 99) == 3
    assert math.isnan(percentile([], 50))
    data = [float(v) for v in random.Random(0).sample(range(10000), 1001)]
    # statistics' "inclusive" quantiles use the same linear rule.
    cuts = statistics.quantiles(data, n=100, method="inclusive")
    assert percentile(data, 90) == pytest.approx(cuts[89])
    assert percentile(data, 99) == pytest.approx(cuts[98])
    with pytest.raises(ValueError, match=r"outside 0\.\.100"):
        percentile(values, 101)


def test_stats_of() -> None:
    stats = Stats.of([4.0, 1.0, 3.0, 2.0])
    assert (stats.count, stats.mean, stats.p50, stats.max) == (4, 2.5, 2.5, 4.0)
    assert stats.p90 == pytest.approx(3.7)
    empty = Stats.of([])
    assert empty.count == 0 and math.isnan(empty.p99)


# -- per-request measurements and the summary -----------------------------------------------

def _result(index: int, sent: float, messages: list[tuple[float, int]], *,
            error: str | None = None, finish: float | None = None, preemptions: int = 0,
            drafts: int = 0, accepted: int = 0) -> RequestResult:
    return RequestResult(index, sent, messages,
                         finish if finish is not None else (messages[-1][0] if messages
                                                            else sent),
                         error, num_preemptions=preemptions, num_draft_tokens=drafts,
                         num_accepted_draft_tokens=accepted)


def test_request_timings() -> None:
    # Sent at 10.0; first token at 10.5; then a message of 4 tokens 0.2 s later, 1 token
    # 0.1 s after that; the stream ends at 10.9.
    r = _result(0, 10.0, [(10.5, 1), (10.7, 4), (10.8, 1)], finish=10.9)
    assert r.ttft_s == pytest.approx(0.5)
    assert r.e2e_s == pytest.approx(0.9)
    assert r.output_tokens == 6
    assert r.itl_s() == pytest.approx([0.05] * 4 + [0.1])  # per token, token-weighted
    # The mean ITL is the decode time per token after the first: (10.8 - 10.5) / 5.
    assert statistics.fmean(r.itl_s()) == pytest.approx(0.3 / 5)
    lonely = _result(1, 0.0, [(0.2, 3)])
    assert lonely.itl_s() == [] and lonely.ttft_s == pytest.approx(0.2)
    failed = _result(2, 0.0, [], error="UNAVAILABLE", finish=0.01)
    assert failed.ttft_s is None and not failed.ok


def test_summary_math() -> None:
    results = [
        _result(0, 0.0, [(0.1, 1), (0.3, 2)], finish=0.3, drafts=6, accepted=1),
        _result(1, 0.5, [(1.0, 1), (1.2, 1), (1.4, 1)], finish=1.5, preemptions=1,
                drafts=4, accepted=3),
        _result(2, 0.2, [(0.4, 2)], error="DEADLINE_EXCEEDED", finish=0.6),
        _result(3, 0.3, [], error="UNAVAILABLE", finish=0.31),
    ]
    s = summarize(results)
    assert (s.num_requests, s.num_ok) == (4, 2)
    assert s.errors == {"DEADLINE_EXCEEDED": 1, "UNAVAILABLE": 1}
    assert s.wall_s == pytest.approx(1.5)  # first send 0.0 to last finish 1.5
    assert s.output_tokens == 3 + 3 + 2  # a failed stream's tokens were produced too
    assert s.output_tokens_per_s == pytest.approx(8 / 1.5)
    assert s.requests_per_s == pytest.approx(2 / 1.5)
    # Latencies only from the requests that finished.
    assert s.ttft_s.count == 2 and s.ttft_s.mean == pytest.approx((0.1 + 0.5) / 2)
    assert s.e2e_s.max == pytest.approx(1.0)
    assert s.itl_s.count == 2 + 2  # request 0: 2 tokens of 0.1; request 1: two of 0.2
    assert s.itl_s.mean == pytest.approx((0.1 + 0.1 + 0.2 + 0.2) / 4)
    assert (s.num_preemptions, s.num_draft_tokens, s.num_accepted_draft_tokens) == (1, 10, 4)
    assert s.draft_acceptance == pytest.approx(0.4)

    d = s.to_dict()
    assert d["draft_acceptance"] == pytest.approx(0.4)
    assert d["errors"] == {"DEADLINE_EXCEEDED": 1, "UNAVAILABLE": 1}
    assert d["ttft_s"]["p50"] == pytest.approx(0.3)
    table = format_table(s)
    assert "2/4 ok" in table and "DEADLINE_EXCEEDED 1" in table and "(40.0%)" in table


def test_summary_without_drafts_or_results() -> None:
    s = summarize([_result(0, 0.0, [(0.1, 1)], finish=0.1)])
    assert math.isnan(s.draft_acceptance)  # no speculation is not "0 % accepted"
    d = s.to_dict()
    assert d["draft_acceptance"] is None and d["itl_s"]["mean"] is None  # JSON has no NaN
    empty = summarize([_result(0, 0.0, [], error="UNAVAILABLE")])
    assert empty.wall_s == 0 and math.isnan(empty.output_tokens_per_s)
    assert "errors: UNAVAILABLE 1" in format_table(empty)
