"""WatchStatus progress streams and the Prometheus endpoint, against real servers."""

from __future__ import annotations

import asyncio
import urllib.request
from typing import Any

import grpc
import pytest

from tests.grpc_harness import FakeEngine, run, serving
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.client.errors import WarmgateRpcError
from warmgate.server.core.phases import PLAN_PHASES
from warmgate.v1 import warmup_pb2 as pb


async def _collect(client: AsyncWarmgateClient,
                   subscribed: asyncio.Event | None = None) -> list[pb.WarmupStatus]:
    statuses = []
    async for status in client.watch_status():
        statuses.append(status)
        if subscribed is not None:
            subscribed.set()  # the first message arrived: the watch sees every later change
    return statuses


async def _watch_while(client: AsyncWarmgateClient, action: Any) -> list[pb.WarmupStatus]:
    subscribed = asyncio.Event()
    watch = asyncio.ensure_future(_collect(client, subscribed))
    await asyncio.wait_for(subscribed.wait(), 10)
    await action()
    return await watch


def test_watch_streams_real_plan_progress_to_ready() -> None:
    async def body() -> None:
        async with serving() as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.mixed_warmup(2)  # the model is loaded once this returns
            statuses = await _watch_while(c, c.warmup_kernels)
            assert statuses[0].state == pb.WARMUP_STATE_PENDING
            assert statuses[-1].state == pb.WARMUP_STATE_READY
            assert statuses[-1].last_report.outcome == pb.WARMUP_OUTCOME_SUCCEEDED
            running = [st for st in statuses if st.state == pb.WARMUP_STATE_RUNNING]
            phases = {st.current_phase for st in running}
            # Changes coalesce (a watcher sees the latest status when it looks), so a phase
            # of a few milliseconds on a loaded machine may pass unseen: require progress
            # through several of the plan's phases, not every one.
            assert phases - {""} <= set(PLAN_PHASES) and len(phases - {""}) >= 2, phases
            assert all(st.num_phases == len(PLAN_PHASES) and st.steps_done <= st.steps_total
                       for st in running)
            order = [st.phase_index for st in running if st.current_phase]
            assert order == sorted(order)  # phases only move forward

    run(body())


def test_watch_estimates_remaining_from_finished_phases() -> None:
    async def body() -> None:
        engine = FakeEngine(phases=("a", "b", "c"), steps=2, step_s=0.05)
        async with serving(engine=engine) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.mixed_warmup(2)
            statuses = await _watch_while(c, c.warmup_kernels)
            later = [st for st in statuses if st.current_phase == "b"]
            assert later and all(st.HasField("estimated_remaining") for st in later)
            # Without following, a settled server ends the stream at once.
            assert [st.state for st in await _collect(c)] == [pb.WARMUP_STATE_READY]

    run(body())


def test_metrics_endpoint_serves_phase_histogram_and_rpc_counts() -> None:
    async def body() -> None:
        async with serving() as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()
            with pytest.raises(WarmgateRpcError):
                await c.mixed_warmup(-1)
            await c.health()
            url = f"http://127.0.0.1:{s.metrics_port}/metrics"
            text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5)
                                           .read().decode())
        assert 'warmgate_phase_duration_seconds_bucket{le="1800.0",phase="kernels.prefill"}' \
            in text
        assert 'warmgate_phase_skipped_total{phase="cuda_graphs",reason="no_cuda"} 1.0' in text
        # One start loads once, though the first plan's report repeats the load phase.
        assert 'warmgate_phase_duration_seconds_count{phase="load"} 1.0' in text
        assert 'warmgate_warmup_state{state="ready"} 1.0' in text
        assert 'warmgate_warmup_state{state="pending"} 0.0' in text
        assert "warmgate_ready 1.0" in text
        assert ('warmgate_rpc_requests_total{code="INVALID_ARGUMENT",'
                'method="/warmgate.v1.Warmup/MixedWarmup"} 1.0') in text
        assert 'warmgate_rpc_requests_total{code="OK",method="/grpc.health.v1.Health/Check"}' \
            in text
        for declared in ("warmgate_jit_compiles_total", "warmgate_compile_cache_hits_total",
                         "warmgate_compile_cache_misses_total", "warmgate_rpc_duration_seconds"):
            assert f"# TYPE {declared.removesuffix('_total')}" in text

    run(body())


def test_two_servers_do_not_share_a_port_or_metrics() -> None:
    async def body() -> None:
        async with serving() as a, serving() as b:
            assert a.port != b.port and a.metrics_port != b.metrics_port
            assert a.metrics.registry is not b.metrics.registry
            async with AsyncWarmgateClient(f"127.0.0.1:{b.port}") as c:
                with pytest.raises(WarmgateRpcError) as info:
                    await c.mixed_warmup(-3)
                assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT

    run(body())
