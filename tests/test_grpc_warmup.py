"""WarmupKernels and MixedWarmup over a real in-process server with the tiny real runner."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2

from tests.grpc_harness import run, server_config, serving
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.client.api import WaitResult
from warmgate.client.errors import WarmgateRpcError
from warmgate.server.core.phases import PLAN_PHASES
from warmgate.v1 import warmup_pb2 as pb

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def test_health_not_serving_before_warmup_and_serving_after() -> None:
    async def body() -> None:
        async with serving() as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            for service in ("", "warmgate.v1.Warmup"):
                assert await c.health(service) == NOT_SERVING
            # Liveness never waits for warmup: the process is up, so it is alive.
            assert await c.health("liveness") == SERVING
            assert (await c.get_status()).state == pb.WARMUP_STATE_PENDING
            report = await c.warmup_kernels()
            assert report.outcome == pb.WARMUP_OUTCOME_SUCCEEDED
            for service in ("", "warmgate.v1.Warmup"):
                assert await c.health(service) == SERVING
            status = await c.get_status()
            assert status.state == pb.WARMUP_STATE_READY
            assert status.last_report.outcome == pb.WARMUP_OUTCOME_SUCCEEDED

    run(body())


def test_report_lists_every_phase_with_status_and_duration() -> None:
    async def body() -> None:
        async with serving() as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            report = await c.warmup_kernels()
            assert [p.name for p in report.phases] == list(PLAN_PHASES)
            for p in report.phases:
                assert p.status != pb.PHASE_STATUS_UNSPECIFIED
                assert p.HasField("duration")
                if p.status == pb.PHASE_STATUS_SKIPPED:
                    assert p.skip_reason != pb.SKIP_REASON_UNSPECIFIED and p.detail
            by_name = {p.name: p for p in report.phases}
            assert by_name["kernels.prefill"].status == pb.PHASE_STATUS_RAN
            assert by_name["kernels.prefill"].duration.ToNanoseconds() > 0
            assert by_name["cuda_graphs"].skip_reason == pb.SKIP_REASON_NO_CUDA  # CPU
            assert report.config_hash == s.controller.status().identity.config_hash
            assert (report.device, report.attention_backend, report.model) == \
                ("cpu", "torch", "tiny")
            assert not report.joined_in_flight and not report.from_stored

    run(body())


def test_repeat_returns_stored_report_unless_forced() -> None:
    async def body() -> None:
        async with serving() as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            first = await c.warmup_kernels()
            again = await c.warmup_kernels()
            assert again.from_stored and not again.joined_in_flight
            assert list(again.phases) == list(first.phases)
            forced = await c.warmup_kernels(force=True)
            assert not forced.from_stored
            # The model is loaded once: only the first plan reports the load phase.
            assert "load" not in [p.name for p in forced.phases]

    run(body())


def test_mixed_warmup_two_tokens_is_a_skip_not_an_error() -> None:
    async def body() -> None:
        async with serving() as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            report = await c.mixed_warmup(2)
            assert report.outcome == pb.WARMUP_OUTCOME_SUCCEEDED
            [phase] = report.phases
            assert phase.name == "mixed"
            assert phase.status == pb.PHASE_STATUS_SKIPPED
            assert phase.skip_reason == pb.SKIP_REASON_NUM_TOKENS_LT_3
            ran = await c.mixed_warmup(8)
            assert ran.phases[0].status == pb.PHASE_STATUS_RAN
            assert (await c.mixed_warmup(8)).from_stored
            # A mixed warmup alone does not make the server ready.
            assert await c.health() == NOT_SERVING

    run(body())


@pytest.mark.parametrize(("num_tokens", "fragment"), [(-1, ">= 0"),
                                                      (10_000, "max_num_batched_tokens")])
def test_mixed_warmup_out_of_range_is_invalid_argument(num_tokens: int, fragment: str) -> None:
    async def body() -> None:
        async with serving() as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()
            with pytest.raises(WarmgateRpcError) as info:
                await c.mixed_warmup(num_tokens)
            err = info.value
            assert err.code is grpc.StatusCode.INVALID_ARGUMENT
            assert [v.subject for v in err.field_violations] == ["num_tokens"]
            assert fragment in err.field_violations[0].description
            # The server is still up and still ready.
            assert await c.health() == SERVING
            assert (await c.get_status()).state == pb.WARMUP_STATE_READY

    run(body())


def test_warmup_kernels_validates_mixed_num_tokens() -> None:
    async def body() -> None:
        async with serving() as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            with pytest.raises(WarmgateRpcError) as info:
                await c.warmup_kernels(mixed_num_tokens=-5)
            assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT
            assert info.value.field_violations[0].subject == "mixed_num_tokens"
            report = await c.warmup_kernels(mixed_num_tokens=2)
            mixed = next(p for p in report.phases if p.name == "mixed")
            assert mixed.skip_reason == pb.SKIP_REASON_NUM_TOKENS_LT_3

    run(body())


def test_warmup_on_start_becomes_ready_without_a_call() -> None:
    async def body() -> None:
        config = server_config("--warmup-on-start")
        async with serving(config) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            assert await c.wait_ready(timeout=20) is WaitResult.READY
            report = await c.warmup_kernels()
            assert report.from_stored or report.joined_in_flight

    run(body())


def test_an_unexpected_handler_error_is_internal_and_the_server_keeps_serving() -> None:
    async def body() -> None:
        async with serving() as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            def broken() -> None:
                raise ZeroDivisionError("division by zero")

            s.controller.status = broken  # type: ignore[method-assign]
            with pytest.raises(WarmgateRpcError) as info:
                await c.get_status()
            assert info.value.code is grpc.StatusCode.INTERNAL
            assert "ZeroDivisionError" in info.value.message
            assert await c.health() == NOT_SERVING  # still answering

    run(body())
