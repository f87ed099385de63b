"""WatchStatus streams are capped (--max-status-watchers): past the cap a watch is refused
RESOURCE_EXHAUSTED naming the flag, a closed watch frees its slot, and health stays fast.
Unauthenticated and unbounded, 3,000 follow streams added 95 MB and slowed a health Check
to 1.7 s."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from tests.grpc_harness import FakeEngine, run, server_config, serving
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.client.errors import WarmgateRpcError
from warmgate.server.startup import load_server_config
from warmgate.v1 import warmup_pb2 as pb

SERVING = 1  # grpc.health.v1 SERVING
CAP = 4
REFUSED = 300
HEALTH_S = 0.1


async def _first_or_error(watch: AsyncIterator[pb.WarmupStatus]
                          ) -> pb.WarmupStatus | WarmgateRpcError:
    try:
        return await anext(watch)
    except WarmgateRpcError as exc:
        return exc


def _refused(got: object) -> bool:
    return (isinstance(got, WarmgateRpcError)
            and got.code is grpc.StatusCode.RESOURCE_EXHAUSTED
            and f"(--max-status-watchers {CAP})" in got.message)


def test_watchers_past_the_cap_are_refused_and_health_stays_fast() -> None:
    async def body() -> None:
        config = server_config("--max-status-watchers", str(CAP))
        async with serving(config, engine=FakeEngine()) as s, \
                AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()
            open_watches = [c.watch_status(follow=True) for _ in range(CAP)]
            for watch in open_watches:  # each holds its slot once its first status came
                assert (await anext(watch)).state == pb.WARMUP_STATE_READY
            burst = [c.watch_status(follow=True) for _ in range(REFUSED)]
            got = await asyncio.gather(*(_first_or_error(w) for w in burst))
            assert all(_refused(g) for g in got), [g for g in got if not _refused(g)][:3]
            assert f"{CAP} WatchStatus streams are open" in str(got[0])
            # Health does not wait behind the watches: they are few, whatever is asked.
            latencies = []
            for _ in range(5):
                start = time.perf_counter()
                assert await c.health() == SERVING
                latencies.append(time.perf_counter() - start)
            assert statistics.median(latencies) < HEALTH_S, latencies
            # The followers still get every change (a forced warmup), and a closed watch
            # frees its slot.
            await c.warmup_kernels(force=True)
            assert (await anext(open_watches[0])).state in (pb.WARMUP_STATE_RUNNING,
                                                            pb.WARMUP_STATE_READY)
            await open_watches.pop().aclose()
            deadline = time.monotonic() + 10
            while True:  # the server sees the cancel a moment after the client sends it
                again = c.watch_status(follow=True)
                first = await _first_or_error(again)
                if isinstance(first, pb.WarmupStatus):
                    open_watches.append(again)
                    break
                assert _refused(first) and time.monotonic() < deadline
                await asyncio.sleep(0.02)
            for watch in open_watches:
                await watch.aclose()
            reg = s.metrics.registry
            refused = reg.get_sample_value("warmgate_rpc_requests_total", {
                "method": "/warmgate.v1.Warmup/WatchStatus", "code": "RESOURCE_EXHAUSTED"})
            assert refused is not None and refused >= REFUSED

    run(body(), 60)


def test_the_cap_is_a_flag_with_a_default_and_refuses_zero() -> None:
    assert server_config().max_status_watchers == 64
    assert load_server_config(["--max-status-watchers", "8"], environ={}
                              ).max_status_watchers == 8
    with pytest.raises(SystemExit) as info:
        load_server_config(["--max-status-watchers", "0"], environ={})
    assert info.value.code == 2
