"""Single flight: concurrent WarmupKernels calls share one run; failures re-arm readiness."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from tests.grpc_harness import (
    CountingPlanEngine,
    FakeEngine,
    eventually,
    run,
    server_config,
    serving,
)
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.client.errors import WarmgateRpcError
from warmgate.v1 import warmup_pb2 as pb

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def test_twenty_concurrent_calls_run_the_real_plan_once() -> None:
    async def body() -> None:
        config = server_config()
        engine = CountingPlanEngine(config.runner)
        async with serving(config, engine) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            reports = await asyncio.gather(*(c.warmup_kernels() for _ in range(20)))
            assert engine.plan_runs == 1
            assert all(r.outcome == pb.WARMUP_OUTCOME_SUCCEEDED for r in reports)
            started = [r for r in reports if not r.joined_in_flight and not r.from_stored]
            assert len(started) == 1
            assert all(list(r.phases) == list(started[0].phases) for r in reports)

    run(body())


def test_callers_arriving_during_a_run_join_it() -> None:
    async def body() -> None:
        gate = threading.Event()
        engine = FakeEngine(gate=gate)
        async with serving(engine=engine) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            arrived = []
            controller_call = s.controller.warmup_kernels

            async def counted(**kwargs: Any) -> Any:
                arrived.append(1)
                return await controller_call(**kwargs)

            s.controller.warmup_kernels = counted  # type: ignore[method-assign]
            calls = [asyncio.ensure_future(c.warmup_kernels(force=i % 2 == 0))
                     for i in range(20)]
            # Every call reaches the controller while the run is held at the gate.
            await eventually(lambda: engine.plan_runs == 1 and len(arrived) == 20)
            assert await c.health() == NOT_SERVING  # health answers while the run is held
            gate.set()
            reports = await asyncio.gather(*calls)
            assert engine.plan_runs == 1
            assert sum(r.joined_in_flight for r in reports) == 19

    run(body())


def test_a_cancelled_caller_does_not_cancel_the_shared_run() -> None:
    async def body() -> None:
        gate = threading.Event()
        engine = FakeEngine(gate=gate)
        async with serving(engine=engine) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            waiter = asyncio.ensure_future(c.warmup_kernels())
            with pytest.raises(WarmgateRpcError) as info:
                await c.warmup_kernels(timeout=0.3)
            assert info.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
            gate.set()
            report = await waiter
            assert report.outcome == pb.WARMUP_OUTCOME_SUCCEEDED and engine.plan_runs == 1

    run(body())


def test_failed_forced_rewarmup_turns_health_not_serving() -> None:
    async def body() -> None:
        engine = FakeEngine()
        async with serving(engine=engine) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            assert (await c.warmup_kernels()).outcome == pb.WARMUP_OUTCOME_SUCCEEDED
            assert await c.health("warmgate.v1.Warmup") == SERVING
            engine.fail_phase = "kernels.decode"
            failed = await c.warmup_kernels(force=True)
            assert failed.outcome == pb.WARMUP_OUTCOME_FAILED
            assert await c.health() == NOT_SERVING
            assert await c.health("warmgate.v1.Warmup") == NOT_SERVING
            status = await c.get_status()
            assert status.state == pb.WARMUP_STATE_FAILED
            assert "kernels.decode: boom" in status.failure_reason
            # The stored success is gone: a plain repeat runs again instead of lying.
            engine.fail_phase = None
            again = await c.warmup_kernels()
            assert not again.from_stored and engine.plan_runs == 3
            assert await c.health() == SERVING

    run(body())


def test_failed_load_is_failed_precondition_and_failed_state() -> None:
    async def body() -> None:
        engine = FakeEngine(load_fails=True)
        async with serving(engine=engine) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await eventually(lambda: s.controller.status().state.value == "failed")
            with pytest.raises(WarmgateRpcError) as info:
                await c.warmup_kernels()
            err = info.value
            assert err.code is grpc.StatusCode.FAILED_PRECONDITION
            assert "weights not found" in err.message
            assert [v.subject for v in err.precondition_violations] == ["model"]
            with pytest.raises(WarmgateRpcError):
                await c.mixed_warmup(8)
            assert await c.health() == NOT_SERVING
            assert engine.plan_runs == 0

    run(body())
