"""The serving rehearsal: two requests through Generate before health first turns SERVING, so
the serving loop's own code (handler, driver, scheduler, engine process) is warm for the first
client. A real server on the tiny model (CPU)."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncGenerator

import pytest

from tests.grpc_harness import run, server_config, serving
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.server.api import rehearsal
from warmgate.server.app import RunningServer
from warmgate.server.serving.limits import SchedulerLimits
from warmgate.v1 import generate_pb2 as gen_pb
from warmgate.v1 import warmup_pb2 as pb

SERVING, NOT_SERVING = 1, 2  # grpc.health.v1


def _limits(max_model_len: int, k: int = 0, num_blocks: int = 64) -> SchedulerLimits:
    return SchedulerLimits(max_num_seqs=4, max_num_batched_tokens=64, num_blocks=num_blocks,
                           block_size=16, max_model_len=max_model_len, num_speculative_steps=k)


def test_the_first_prompt_is_a_prefill_and_both_fit_the_model_length() -> None:
    first, second = rehearsal.rehearsal_requests(_limits(4096, k=3), vocab_size=512)
    assert len(first.prompt_token_ids) == 5  # 2 + num_speculative_steps: never a decode
    assert first.sampling.temperature == 0 and second.sampling.temperature == 1.0
    assert second.sampling.HasField("seed") and first.sampling.ignore_eos
    assert all(0 < t < 512 for t in [*first.prompt_token_ids, *second.prompt_token_ids])
    assert len(second.prompt_token_ids) > len(first.prompt_token_ids)
    for length in (16, 40):
        for req in rehearsal.rehearsal_requests(_limits(length), vocab_size=512):
            assert len(req.prompt_token_ids) + req.sampling.max_tokens <= length
    # A cache of 3 usable blocks (48 tokens) under a 4096-token model: each fits it alone.
    for req in rehearsal.rehearsal_requests(_limits(4096, num_blocks=4), vocab_size=512):
        assert len(req.prompt_token_ids) + req.sampling.max_tokens <= 48


def _count(s: RunningServer, name: str, labels: dict[str, str] | None = None) -> float:
    return s.metrics.registry.get_sample_value(name, labels or {}) or 0.0


@pytest.mark.parametrize("engine", ["--no-engine-process", "--engine-process"])
def test_ready_comes_after_a_prefill_decodes_and_a_mixed_step_went_through_generate(
        engine: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="warmgate.server.api.generation")

    async def body() -> None:
        async with serving(server_config(engine)) as s, \
                AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()
            assert await c.health() == SERVING
            # An engine process's step statistics come on their own messages, the last ones
            # possibly after the stream's end; they are all in once its serving run returned.
            assert await s.controller.wait_runner_idle(10)
            steps = {kind: _count(s, "warmgate_step_duration_seconds_count", {"kind": kind})
                     for kind in ("prefill", "decode", "mixed")}
            assert all(n > 0 for n in steps.values()), steps
            # The first request (64 tokens) was cut once the second had its first token.
            assert sum(steps.values()) < rehearsal.FIRST_MAX_TOKENS - 8, steps
            # A client never sent them: the request metrics start at zero.
            assert _count(s, "warmgate_generated_tokens_total") == 0
            assert _count(s, "warmgate_time_to_first_token_seconds_count") == 0
            assert not s.generation._driver.num_requests  # both finished
            # Once per process: a forced re-warmup runs no serving step.
            await c.warmup_kernels(force=True)
            assert await c.health() == SERVING
            assert sum(_count(s, "warmgate_step_duration_seconds_count", {"kind": kind})
                       for kind in steps) == sum(steps.values())

    run(body(), 120)
    assert re.search(r"serving rehearsal: 2 requests, \d+ tokens through Generate in [\d.]+ ms",
                     caplog.text)


def test_a_failed_rehearsal_keeps_health_not_serving_until_a_forced_warmup_passes_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = rehearsal.rehearsal_requests

    def out_of_vocabulary(limits: SchedulerLimits, vocab_size: int
                          ) -> tuple[gen_pb.GenerateRequest, gen_pb.GenerateRequest]:
        first, second = real(limits, vocab_size)
        second.prompt_token_ids[0] = vocab_size  # refused by Generate's own checks
        return first, second

    async def body() -> None:
        async with serving(server_config("--no-engine-process")) as s, \
                AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            monkeypatch.setattr(rehearsal, "rehearsal_requests", out_of_vocabulary)
            report = await c.warmup_kernels()
            assert report.outcome == pb.WARMUP_OUTCOME_FAILED
            assert [p.name for p in report.phases if p.status == pb.PHASE_STATUS_FAILED] == [
                "serving_rehearsal"]  # every plan phase passed
            assert await c.health() == NOT_SERVING
            status = await c.get_status()
            assert status.state == pb.WARMUP_STATE_FAILED
            assert "serving_rehearsal: requests through Generate" in status.failure_reason
            assert "outside the vocabulary" in status.failure_reason
            assert _count(s, "warmgate_phase_duration_seconds_count",
                          {"phase": "serving_rehearsal"}) == 1  # named, not "other"
            monkeypatch.undo()
            assert (await c.warmup_kernels()).outcome == pb.WARMUP_OUTCOME_SUCCEEDED
            assert await c.health() == SERVING
            assert (await c.get_status()).state == pb.WARMUP_STATE_READY

    run(body(), 120)


@pytest.mark.parametrize("flags", [
    ("--max-model-len", "16", "--num-speculative-steps", "3"),  # the shortest the plan warms
    ("--num-blocks", "5", "--max-num-seqs", "2"),  # a cache that holds one request at a time
], ids=["short-model", "small-cache"])
def test_a_server_at_its_tightest_limits_passes_the_rehearsal(flags: tuple[str, ...]) -> None:
    async def body() -> None:
        async with serving(server_config("--no-engine-process", *flags)) as s, \
                AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            assert (await c.warmup_kernels()).outcome == pb.WARMUP_OUTCOME_SUCCEEDED
            assert await c.health() == SERVING

    run(body(), 120)


def test_readiness_lost_while_the_rehearsal_runs_fails_the_plan_with_that_reason() -> None:
    """As a compile under --strict-jit fail does (the policy's own call, from the compiling
    thread): the loss lands while the rehearsal's requests run."""

    async def body() -> None:
        async with serving(server_config("--no-engine-process")) as s, \
                AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            async def rehearse_then_compile() -> None:
                await s.generation.rehearse()
                s.controller._jit_failed_threadsafe("compile after ready: triton (a test's)")
                await asyncio.sleep(0.1)  # the loss is posted to the event loop

            s.controller.set_rehearsal(rehearse_then_compile)
            report = await c.warmup_kernels()
            assert report.outcome == pb.WARMUP_OUTCOME_FAILED
            assert report.phases[-1].name == "serving_rehearsal"
            assert "compile after ready: triton (a test's)" in report.phases[-1].detail
            assert await c.health() == NOT_SERVING
            status = await c.get_status()
            assert status.state == pb.WARMUP_STATE_FAILED
            assert "compile after ready" in status.failure_reason

    run(body(), 120)


def test_the_first_stream_is_cut_once_the_second_has_its_first_token() -> None:
    """The order the abort path needs, on fake streams: the first is closed (its request
    aborted) after the second's first message and before the second's next one."""
    log: list[str] = []

    async def first_stream() -> AsyncGenerator[gen_pb.GenerateResponse, None]:
        try:
            while True:  # a request that would run on
                log.append("first token")
                yield gen_pb.GenerateResponse(token_ids=[1])
        finally:
            log.append("first closed")

    async def second_stream() -> AsyncGenerator[gen_pb.GenerateResponse, None]:
        for n in range(3):
            log.append(f"second token {n}")
            yield gen_pb.GenerateResponse(token_ids=[2])

    def generate(request: gen_pb.GenerateRequest
                 ) -> AsyncGenerator[gen_pb.GenerateResponse, None]:
        return first_stream() if request.request_id.endswith("greedy") else second_stream()

    first, second = rehearsal.rehearsal_requests(_limits(4096), vocab_size=512)
    result = run(rehearsal.rehearse(generate, first, second))
    assert log == ["first token", "second token 0", "first closed", "second token 1",
                   "second token 2"]
    assert result.num_tokens == 4
