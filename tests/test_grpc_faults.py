"""Faults injected into the real plan over a real server: OOM, compile errors, a fatal CUDA
error, and callers that cancel or run out of deadline while a warmup is in flight."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from tests.grpc_harness import FakeEngine, eventually, run, server_config, serving
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.client.errors import WarmgateRpcError
from warmgate.server.config.faults import Fault
from warmgate.server.control.engine import PlanEngine
from warmgate.server.control.faults import FaultInjector
from warmgate.v1 import warmup_pb2 as pb
from warmgate.v1 import warmup_pb2_grpc as pb_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
ILLEGAL = "CUDA error: an illegal memory access was encountered"


def faulty_engine(*faults: Fault) -> tuple[PlanEngine, FaultInjector]:
    injector = FaultInjector(faults)
    return PlanEngine(server_config().runner, faults=injector), injector


def phases_of(report: pb.WarmupReport) -> dict[str, pb.PhaseResult]:
    return {p.name: p for p in report.phases}


@pytest.mark.parametrize(("phase", "kind", "advice"), [
    ("kernels.decode", "oom", "lower --max-num-batched-tokens or --max-num-seqs"),
    ("kernels.sampler", "compile", "try --attention-backend torch"),
    ("mixed", "oom", "lower --max-num-batched-tokens"),
])
def test_a_recoverable_fault_fails_its_phase_with_advice_and_a_forced_retry_recovers(
        phase: str, kind: str, advice: str) -> None:
    async def body() -> None:
        engine, injector = faulty_engine(Fault(phase, kind))
        async with serving(engine=engine) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            report = await c.warmup_kernels()
            assert report.outcome == pb.WARMUP_OUTCOME_FAILED
            failed = phases_of(report)[phase]
            assert failed.status == pb.PHASE_STATUS_FAILED and advice in failed.detail
            names = [p.name for p in report.phases]
            for later in names[names.index(phase) + 1:]:
                assert phases_of(report)[later].skip_reason == \
                    pb.SKIP_REASON_EARLIER_PHASE_FAILED
            assert [f.phase for f in injector.fired] == [phase]
            # Not ready, the reason is in GetStatus, and the server keeps answering.
            assert await c.health() == NOT_SERVING
            assert await c.health("liveness") == SERVING
            status = await c.get_status()
            assert status.state == pb.WARMUP_STATE_FAILED
            assert phase in status.failure_reason and advice in status.failure_reason
            retry = await c.warmup_kernels(force=True)
            assert retry.outcome == pb.WARMUP_OUTCOME_SUCCEEDED
            assert await c.health() == SERVING
            assert (await c.get_status()).state == pb.WARMUP_STATE_READY
            assert s.controller.fatal_error is None

    run(body())


def test_oom_in_a_mixed_warmup_is_reported_and_leaves_readiness_alone() -> None:
    async def body() -> None:
        engine, _ = faulty_engine(Fault("mixed", "oom"))
        async with serving(engine=engine) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            report = await c.mixed_warmup(8)
            [phase] = report.phases
            assert phase.status == pb.PHASE_STATUS_FAILED and "out of memory" in phase.detail
            assert (await c.mixed_warmup(8)).phases[0].status == pb.PHASE_STATUS_RAN
            assert (await c.warmup_kernels()).outcome == pb.WARMUP_OUTCOME_SUCCEEDED
            assert await c.health() == SERVING

    run(body())


def test_a_fatal_cuda_error_takes_every_health_service_down_for_good() -> None:
    async def body() -> None:
        engine, _ = faulty_engine(Fault("kernels.decode", "cuda_fatal"))
        async with serving(engine=engine) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            report = await c.warmup_kernels()
            assert report.outcome == pb.WARMUP_OUTCOME_FAILED
            detail = phases_of(report)["kernels.decode"].detail
            assert "fatal CUDA error" in detail and "illegal memory access" in detail
            fatal = await asyncio.wait_for(s.controller.wait_fatal(), 5)
            assert "illegal memory access" in str(fatal)
            for service in ("", "warmgate.v1.Warmup", "liveness"):
                assert await c.health(service) == NOT_SERVING
            status = await c.get_status()
            assert status.state == pb.WARMUP_STATE_FAILED
            assert "exits with code 70" in status.failure_reason
            # No more runner work: the context is gone.
            with pytest.raises(WarmgateRpcError) as info:
                await c.warmup_kernels(force=True)
            assert info.value.code is grpc.StatusCode.UNAVAILABLE
            # Nothing can flip health back (set() is ignored after enter_graceful_shutdown).
            await s.health.set("", SERVING)
            assert await c.health() == NOT_SERVING

    run(body())


def test_a_fatal_error_escaping_a_handler_is_unavailable_and_fatal() -> None:
    async def body() -> None:
        async with serving(engine=FakeEngine()) as s, \
                AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            def broken() -> None:
                raise RuntimeError(ILLEGAL)

            s.controller.status = broken  # type: ignore[method-assign]
            with pytest.raises(WarmgateRpcError) as info:
                await c.get_status()
            assert info.value.code is grpc.StatusCode.UNAVAILABLE
            assert "restarting" in info.value.message
            assert s.controller.fatal_error is not None
            assert await c.health("liveness") == NOT_SERVING

    run(body())


def test_the_caller_that_started_a_warmup_can_cancel_without_aborting_it() -> None:
    async def body() -> None:
        gate = threading.Event()
        engine = FakeEngine(gate=gate)
        async with serving(engine=engine) as s, \
                grpc.aio.insecure_channel(f"127.0.0.1:{s.port}") as channel:
            arrived = []
            controller_call = s.controller.warmup_kernels

            async def counted(**kwargs: Any) -> Any:
                arrived.append(1)
                return await controller_call(**kwargs)

            s.controller.warmup_kernels = counted  # type: ignore[method-assign]
            stub = pb_grpc.WarmupStub(channel)
            starter = stub.WarmupKernels(pb.WarmupKernelsRequest(), timeout=30)
            await eventually(lambda: engine.plan_runs == 1)
            joiner = stub.WarmupKernels(pb.WarmupKernelsRequest(force=True), timeout=30)
            await eventually(lambda: len(arrived) == 2)  # both wait on the one run
            starter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await starter
            gate.set()
            report = await joiner
            assert report.outcome == pb.WARMUP_OUTCOME_SUCCEEDED and report.joined_in_flight
            assert engine.plan_runs == 1
            assert await s.controller.wait_runner_idle(5)

    run(body())


def test_a_short_deadline_is_deadline_exceeded_and_the_warmup_goes_on() -> None:
    async def body() -> None:
        engine, injector = faulty_engine(Fault("kernels.decode", "delay", 0.6))
        async with serving(engine=engine) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            with pytest.raises(WarmgateRpcError) as info:
                await c.warmup_kernels(timeout=0.2)
            assert info.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
            # Nobody waits any more, and the plan still finishes and makes the server ready.
            await eventually(lambda: s.controller.status().state.value == "ready")
            assert await c.health() == SERVING
            assert [f.kind for f in injector.fired] == ["delay"]

    run(body())
