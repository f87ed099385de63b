"""grpc.health.v1 Watch streams are capped (--max-health-watchers) on both ports that serve
health, the main port and the health process's: past the cap a Watch is refused
RESOURCE_EXHAUSTED naming the flag, a closed one frees its slot, and Check stays fast.
Unauthenticated and uncapped, 10,000 Watch streams grew the server by 182 MiB."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.grpc_harness import FakeEngine, run, server_config, serving
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.server.config.server_config import MAX_HEALTH_WATCHERS
from warmgate.server.startup import load_server_config

SERVING = health_pb2.HealthCheckResponse.SERVING
CAP = 4
REFUSED = 100
CHECK_S = 0.1
WATCH = "/grpc.health.v1.Health/Watch"


async def _first(stub: health_pb2_grpc.HealthStub) -> tuple[Any, int | grpc.StatusCode]:
    """A Watch of "" and its first status, or the code it was refused with."""
    call = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=60)
    try:
        return call, (await call.read()).status
    except grpc.aio.AioRpcError as exc:
        assert f"(--max-health-watchers {CAP})" in (exc.details() or ""), exc
        return call, exc.code()


async def _cap_holds(port: int) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        held = [await _first(stub) for _ in range(CAP)]
        assert [status for _, status in held] == [SERVING] * CAP
        burst = await asyncio.gather(*(_first(stub) for _ in range(REFUSED)))
        codes = {status for _, status in burst}
        assert codes == {grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
        latencies = []
        for _ in range(5):  # Check does not wait behind the watches
            start = time.perf_counter()
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            assert reply.status == SERVING
            latencies.append(time.perf_counter() - start)
        assert statistics.median(latencies) < CHECK_S, latencies
        held.pop()[0].cancel()  # a closed watch frees its slot
        deadline = time.monotonic() + 10
        while True:  # the server sees the cancel a moment after the client sends it
            again, status = await _first(stub)
            if status == SERVING:
                held.append((again, status))
                break
            assert status is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        for call, _ in held:
            call.cancel()


def test_health_watches_past_the_cap_are_refused_on_both_ports() -> None:
    async def body() -> None:
        config = server_config("--max-health-watchers", str(CAP), "--health-port", "0")
        async with serving(config, engine=FakeEngine()) as s, \
                AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()
            await _cap_holds(s.port)
            assert s.health_port is not None
            await _cap_holds(s.health_port)
            refused = s.metrics.registry.get_sample_value(
                "warmgate_rpc_requests_total", {"method": WATCH, "code": "RESOURCE_EXHAUSTED"})
            # The main port's refusals at once; the health process reports its own a second
            # later, in its next batch of counts.
            assert refused is not None and refused >= REFUSED
            deadline = time.monotonic() + 10
            while refused < 2 * REFUSED:
                assert time.monotonic() < deadline, refused
                await asyncio.sleep(0.1)
                refused = s.metrics.registry.get_sample_value(
                    "warmgate_rpc_requests_total",
                    {"method": WATCH, "code": "RESOURCE_EXHAUSTED"}) or 0.0

    run(body(), 60)


def test_the_cap_is_a_flag_with_a_default_and_refuses_zero() -> None:
    assert server_config().max_health_watchers == MAX_HEALTH_WATCHERS
    assert load_server_config(["--max-health-watchers", "8"], environ={}
                              ).max_health_watchers == 8
    with pytest.raises(SystemExit) as info:
        load_server_config(["--max-health-watchers", "0"], environ={})
    assert info.value.code == 2
