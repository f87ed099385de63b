"""A seeded request's tokens depend only on (seed, output position): alone, preempted,
with its drafts trimmed by the token budget, and across a forced warmup, for k = 0, 1, 3."""

from __future__ import annotations

import asyncio

import pytest

from tests.grpc_harness import eventually, run, server_config, serving
from tests.runner_helpers import make_runner, prompt
from tests.serving_helpers import Served, greedy
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.server.runner.scheduler_output import SamplingParams
from warmgate.server.serving.request import RequestStatus
from warmgate.server.serving.scheduler import ServingRequest

# Repeats, so the n-gram drafter has real drafts (not only padding) from the first decode.
TARGET_PROMPT = [7, 8, 9, 10] * 3
SEEDED = SamplingParams(temperature=0.8, seed=4242, max_tokens=48)
COMPANIONS = [prompt(n, offset=i) for i, n in enumerate((5, 19, 9, 14))]
KS = [0, 1, 3]


def _alone(k: int) -> list[int]:
    served = Served(make_runner(num_spec=k))
    target = served.submit("target", TARGET_PROMPT, SEEDED)
    served.run()
    assert len(target.output_token_ids) == SEEDED.max_tokens
    if k:
        assert target.usage.num_draft_tokens > 0
    return target.output_token_ids


def _with_companions(served: Served, max_tokens: int) -> ServingRequest:
    others = [served.submit(f"o{i}", p, greedy(max_tokens)) for i, p in enumerate(COMPANIONS)]
    target = served.submit("target", TARGET_PROMPT, SEEDED)  # the newest: preempted first
    served.run()
    assert all(o.status is RequestStatus.FINISHED for o in others)
    return target


@pytest.mark.parametrize("k", KS)
def test_a_preempted_seeded_request_gives_the_tokens_it_gives_alone(k: int) -> None:
    # 41 blocks of 4 tokens (160 tokens) cannot hold the four companions and the target.
    served = Served(make_runner(num_spec=k, num_blocks=41, max_num_seqs=6))
    target = _with_companions(served, 40)
    assert target.usage.num_preemptions > 0
    assert target.output_token_ids == _alone(k)


@pytest.mark.parametrize("k", KS)
def test_drafts_trimmed_by_the_token_budget_leave_a_seeded_request_unchanged(k: int) -> None:
    # The four companions' decodes take 4 * (k + 1) tokens; the target, last in line, gets
    # the k left over: k - 1 drafts.
    budget = 4 * (k + 1) + k
    served = Served(make_runner(num_spec=k, max_num_batched_tokens=budget, max_num_seqs=6))
    target = _with_companions(served, 30)
    assert target.usage.num_preemptions == 0
    if k:
        # Some decode step of the target got fewer than k drafts because the budget ran out.
        assert any(so.total_num_scheduled_tokens == budget
                   and so.num_scheduled_tokens.get("target") == 1 + len(
                       so.scheduled_spec_decode_tokens.get("target", []))
                   and len(so.scheduled_spec_decode_tokens.get("target", [])) < k
                   for so in served.steps)
    assert target.output_token_ids == _alone(k)


@pytest.mark.parametrize("k", KS)
def test_a_seeded_request_resumed_after_a_yield_gives_the_same_tokens(k: int) -> None:
    served = Served(make_runner(num_spec=k))
    target = served.submit("target", TARGET_PROMPT, SEEDED)
    steps = iter(range(1000))
    served.loop.run(lambda: next(steps) == 5)  # a warmup takes the runner after 5 steps
    assert target.status is RequestStatus.WAITING and 0 < len(target.output_token_ids) < 48
    served.run()
    assert target.usage.num_preemptions == 1
    assert target.output_token_ids == _alone(k)


@pytest.mark.parametrize("k", KS)
def test_a_forced_warmup_mid_stream_leaves_seeded_tokens_unchanged(k: int) -> None:
    config = server_config("--num-speculative-steps", str(k))
    params = {"temperature": SEEDED.temperature, "seed": SEEDED.seed,
              "max_tokens": SEEDED.max_tokens}

    async def collect(c: AsyncWarmgateClient) -> list[int]:
        tokens: list[int] = []
        async for message in c.generate(TARGET_PROMPT, **params):  # type: ignore[arg-type]
            tokens += message.token_ids
        return tokens

    async def body() -> None:
        async with serving(config) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()
            alone = await collect(c)
            stream = asyncio.ensure_future(collect(c))
            await eventually(lambda: s.generation.serving_loop is not None
                             and any(r.output_token_ids
                                     for r in s.generation.serving_loop.scheduler.running), 30)
            report = await c.warmup_kernels(force=True)
            assert report.outcome == 1  # SUCCEEDED
            interrupted = await stream
            assert s.metrics.registry.get_sample_value("warmgate_preemptions_total") >= 1
            assert interrupted == alone
            assert len(alone) == SEEDED.max_tokens

    run(body(), 180)


def test_speculation_does_not_change_a_seeded_requests_tokens() -> None:
    # Each position's token is drawn whether or not a draft sits there, so k is invisible.
    assert _alone(1) == _alone(0)
    assert _alone(3) == _alone(0)
