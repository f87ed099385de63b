"""grpc.health.v1 beyond Check: List answers every service (it was INTERNAL with a traceback),
and during the SIGTERM drain readiness is NOT_SERVING while liveness stays SERVING."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.grpc_harness import FakeEngine, eventually, run, server_config, serving
from tests.runner_helpers import prompt
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.server.app import create_server
from warmgate.server.telemetry.metrics import OTHER

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _list(target: str) -> dict[str, int]:
    async with grpc.aio.insecure_channel(target) as channel:
        response = await health_pb2_grpc.HealthStub(channel).List(
            health_pb2.HealthListRequest(), timeout=10)
    return {name: r.status for name, r in response.statuses.items()}


def test_list_answers_every_service_on_both_ports_without_an_error(
        caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        config = server_config("--health-port", "0")
        async with serving(config, engine=FakeEngine()) as s, \
                AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            before = await _list(f"127.0.0.1:{s.port}")
            assert before == {"": NOT_SERVING, "warmgate.v1.Warmup": NOT_SERVING,
                              "liveness": SERVING}
            await c.warmup_kernels()
            for port in (s.port, s.health_port):
                assert await _list(f"127.0.0.1:{port}") == {
                    "": SERVING, "warmgate.v1.Warmup": SERVING, "liveness": SERVING}
            # List is not one of the metric's named methods: it counts under "other". The
            # health port's call is the health process's: its counts come in once a second.
            await eventually(lambda: s.metrics.registry.get_sample_value(
                "warmgate_rpc_requests_total", {"method": OTHER, "code": "OK"}) == 3, 5)

    with caplog.at_level(logging.ERROR):
        run(body())
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_liveness_stays_serving_through_the_drain_while_readiness_turns_not_serving() -> None:
    async def body() -> None:
        s = await create_server(server_config())
        try:
            async with AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
                await c.warmup_kernels()
                # An open stream keeps the drain going for its grace.
                stream = c.generate(prompt(8), max_tokens=100)
                await stream.__anext__()
                stopping = asyncio.ensure_future(s.stop(10.0, wait_for_runner=True))
                await eventually(lambda: s.generation._closing, 10)
                assert await c.health("") == NOT_SERVING
                assert await c.health("warmgate.v1.Warmup") == NOT_SERVING
                assert await c.health("liveness") == SERVING
                assert (await _list(f"127.0.0.1:{s.port}"))["liveness"] == SERVING
                # Nothing turns readiness back during the drain.
                await s.health.set("", SERVING)
                assert await c.health("") == NOT_SERVING
                async for _ in stream:
                    pass
                await stopping
        finally:
            await s.stop(0)

    run(body(), 120)
