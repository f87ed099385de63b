"""A burst of simultaneous health checks is answered, none refused by gRPC's pending-call
limits (above 1,000 waiting calls it cancelled some before any handler or metric saw them)."""

from __future__ import annotations

import asyncio
import collections

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.grpc_harness import FakeEngine, run, serving

NUM_CALLS = 3000
NUM_CHANNELS = 10


def test_3000_simultaneous_checks_from_10_channels_are_all_answered() -> None:
    async def body() -> None:
        async with serving(engine=FakeEngine()) as s:
            channels = [grpc.aio.insecure_channel(f"127.0.0.1:{s.port}")
                        for _ in range(NUM_CHANNELS)]
            stubs = [health_pb2_grpc.HealthStub(c) for c in channels]
            request = health_pb2.HealthCheckRequest(service="liveness")
            codes: collections.Counter[str] = collections.Counter()

            async def check(stub: health_pb2_grpc.HealthStub) -> None:
                # A generous deadline: this test is about refusals, not latency (that is
                # bench/load.py health-latency --burst, on a machine not shared with a test run).
                try:
                    await stub.Check(request, timeout=60)
                    codes["OK"] += 1
                except grpc.aio.AioRpcError as exc:
                    codes[exc.code().name] += 1

            try:
                await asyncio.gather(*(s.Check(request, timeout=30, wait_for_ready=True)
                                       for s in stubs))
                await asyncio.gather(*(check(stubs[i % NUM_CHANNELS])
                                       for i in range(NUM_CALLS)))
            finally:
                await asyncio.gather(*(c.close() for c in channels))
            assert codes == {"OK": NUM_CALLS}
            counted = s.metrics.registry.get_sample_value(
                "warmgate_rpc_requests_total",
                {"method": "/grpc.health.v1.Health/Check", "code": "OK"})
            assert counted == NUM_CALLS + NUM_CHANNELS

    run(body(), 120)
