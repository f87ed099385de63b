"""Issue 16 items 7, 8 and 10 (the load log): a forced re-warmup or a mixed warmup on a ready
server is NOT_SERVING for its duration (the reason in GetStatus) and `wait` blocks through
it; during the SIGTERM drain warmups are UNAVAILABLE; a model load is not logged as a warmup."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from tests.grpc_harness import FakeEngine, eventually, run, server_config, serving
from tests.runner_helpers import prompt
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.client.api import WaitResult
from warmgate.client.errors import WarmgateRpcError
from warmgate.server.core.progress import ProgressCallback
from warmgate.server.core.results import WarmupReport
from warmgate.v1 import warmup_pb2 as pb

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class GatedMixedEngine(FakeEngine):
    """FakeEngine whose mixed warmup, too, waits on the gate."""

    def run_mixed(self, num_tokens: int, *, progress: ProgressCallback) -> WarmupReport:
        assert self.gate is not None
        self.gate.wait(30)
        return super().run_mixed(num_tokens, progress=progress)


async def _ready_server_check(c: AsyncWarmgateClient, gate: threading.Event,
                              start_run: Any) -> None:
    """Warm up, then start a run with the gate closed: NOT_SERVING throughout, wait_ready
    blocks, GetStatus says why; SERVING again once it succeeds."""
    await c.warmup_kernels()
    assert await c.health() == SERVING
    gate.clear()
    task = asyncio.ensure_future(start_run())
    for _ in range(500):
        if await c.health() == NOT_SERVING:
            break
        await asyncio.sleep(0.01)
    assert await c.health() == NOT_SERVING
    status = await c.get_status()
    assert status.not_serving_reason, status
    assert await c.wait_ready(0.5) is WaitResult.TIMEOUT  # blocks through the run
    gate.set()
    report = await task
    assert report.outcome == pb.WARMUP_OUTCOME_SUCCEEDED
    assert await c.wait_ready(5) is WaitResult.READY
    assert (await c.get_status()).not_serving_reason == ""


def test_forced_rewarmup_is_not_serving_until_it_succeeds() -> None:
    gate = threading.Event()
    gate.set()
    engine = FakeEngine(gate=gate)

    async def body() -> None:
        async with serving(engine=engine) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await _ready_server_check(c, gate, lambda: c.warmup_kernels(force=True))
            assert engine.plan_runs == 2

    run(body())


def test_mixed_warmup_is_not_serving_until_it_succeeds() -> None:
    gate = threading.Event()
    gate.set()
    engine = GatedMixedEngine(gate=gate)

    async def body() -> None:
        async with serving(engine=engine) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await _ready_server_check(c, gate, lambda: c.mixed_warmup(8, force=True))
            assert engine.mixed_runs == 1

    run(body())


def test_warmups_during_the_drain_are_unavailable() -> None:
    config = server_config("--max-model-len", "4096", "--num-blocks", "1100")

    async def body() -> None:
        async with serving(config) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels(timeout=120)
            stream = c.generate(prompt(8), max_tokens=4000)
            first = await stream.__anext__()  # the stream is running
            assert first is not None
            stopping = asyncio.ensure_future(s.stop(30))
            await eventually(lambda: s.controller.not_ready_reason() ==
                             "the server is shutting down" or stopping.done())
            for call in (lambda: c.warmup_kernels(force=True), lambda: c.mixed_warmup(8)):
                with pytest.raises(WarmgateRpcError) as info:
                    await call()
                assert info.value.code is grpc.StatusCode.UNAVAILABLE
            assert not stopping.done(), "the stream should still be draining"
            assert s.generation.serving_loop is not None
            assert s.generation.serving_loop.scheduler.num_preemptions == 0
            await stream.aclose()
            await stopping

    run(body(), timeout=120)


def test_a_model_load_is_not_logged_as_a_warmup(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="warmgate.server.report")

    async def body() -> None:
        async with serving(engine=FakeEngine()) as s:
            await eventually(lambda: s.controller.model_loaded)
            await asyncio.sleep(0.05)

    run(body())
    assert not [r for r in caplog.records if "warmup outcome=" in r.getMessage()]
