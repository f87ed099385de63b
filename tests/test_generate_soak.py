"""A seeded soak of Generate: 200 streams in waves over a small KV cache (preemptions), half of
them cancelled part-way, k=2 drafts, greedy / stochastic / seeded sampling, and a forced
warmup between waves. Every stream ends cleanly, nothing is logged as an internal error, and
every KV block and runner slot comes back."""

from __future__ import annotations

import asyncio
import logging
import random

import pytest

from tests.grpc_harness import eventually, run, server_config, serving
from warmgate.client.aio import AsyncWarmgateClient

FLAGS = ("--num-speculative-steps", "2", "--num-blocks", "40", "--block-size", "4",
         "--max-num-seqs", "6", "--max-num-batched-tokens", "32", "--max-model-len", "128")


def test_cancels_preemption_and_a_forced_warmup_leave_nothing_behind(
        caplog: pytest.LogCaptureFixture) -> None:
    rng = random.Random(1)
    counts = {"finished": 0, "cancelled": 0}

    async def one(client: AsyncWarmgateClient, i: int) -> None:
        prompt = [rng.randrange(512) for _ in range(rng.randint(1, 60))]
        cancel_after = rng.choice([None, None, 1, 3])
        stream = client.generate(prompt, max_tokens=rng.randint(1, 60),
                                 temperature=rng.choice([0.0, 0.7]), seed=rng.choice([None, i]),
                                 top_k=rng.choice([0, 5]), stop_token_ids=rng.sample(range(512), 3))
        received = 0
        async for message in stream:
            received += 1
            if message.finish_reason:
                counts["finished"] += 1
            elif cancel_after is not None and received >= cancel_after:
                await stream.aclose()  # type: ignore[attr-defined]
                counts["cancelled"] += 1
                return

    async def body() -> None:
        async with serving(server_config(*FLAGS)) as s, \
                AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()
            for wave in range(5):
                await asyncio.gather(*[one(c, 100 * wave + i) for i in range(40)])
                if wave == 2:
                    await c.warmup_kernels(force=True)
            loop = s.generation.serving_loop
            assert loop is not None
            sched = loop.scheduler
            await eventually(lambda: sched.pool.num_free == sched.pool.num_usable
                             and not sched.has_requests and not loop.runner.input_batch.requests,
                             20)
            assert sched.num_preemptions > 0

    with caplog.at_level(logging.ERROR):
        run(body(), 300)
    assert counts["finished"] + counts["cancelled"] == 200 and counts["cancelled"] > 50
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
