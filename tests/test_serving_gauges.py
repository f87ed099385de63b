"""The occupancy gauges follow blocks freed between steps: cancelled streams, a yield to a
warmup, the last request ending; not only the next step (which may never come)."""

from __future__ import annotations

import time

from tests.grpc_harness import eventually, run, server_config, serving
from tests.runner_helpers import make_runner, prompt
from tests.serving_helpers import greedy
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.server.serving.limits import SchedulerLimits
from warmgate.server.serving.loop import Occupancy, ServingLoop
from warmgate.server.serving.request import ServingRequest
from warmgate.server.serving.scheduler import Scheduler

GAUGES = ("warmgate_requests_running", "warmgate_requests_waiting",
          "warmgate_kv_cache_usage_ratio")


def test_gauges_fall_to_zero_when_every_open_stream_is_cancelled() -> None:
    async def body() -> None:
        async with serving(server_config("--max-model-len", "512")) as s, \
                AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()
            reg = s.metrics.registry
            streams = [c.generate(prompt(20, offset=i), max_tokens=400) for i in range(2)]
            for stream in streams:
                for _ in range(3):
                    await stream.__anext__()
            await eventually(lambda: reg.get_sample_value(GAUGES[0]) == 2, 10)
            assert reg.get_sample_value(GAUGES[2]) > 0
            for stream in streams:
                await stream.aclose()  # cancels the call
            # No other request arrives: the cancel itself must bring the gauges down.
            await eventually(lambda: all(reg.get_sample_value(g) == 0 for g in GAUGES), 10)

    run(body(), 120)


def test_a_yield_to_a_warmup_and_the_last_request_ending_report_occupancy() -> None:
    runner = make_runner()
    seen: list[Occupancy] = []
    loop = ServingLoop(runner, Scheduler(SchedulerLimits.of_config(runner.config)),
                       lambda events: None, on_occupancy=seen.append)
    for i in range(2):
        loop.submit(ServingRequest(f"r{i}", prompt(10, offset=i), greedy(20),
                                   time.perf_counter()))
    steps = iter(range(100))
    loop.run(lambda: next(steps) == 3)  # a warmup is waiting after 3 steps
    # Preempted for the warmup: nothing holds blocks, both wait.
    assert seen[-1] == Occupancy(0, 2, 0, loop.scheduler.pool.num_usable)
    loop.run(lambda: False)
    assert seen[-1] == Occupancy(0, 0, 0, loop.scheduler.pool.num_usable)
    loop.submit(ServingRequest("r9", prompt(10), greedy(50), time.perf_counter()))
    for _ in range(3):
        loop.step()
    count = len(seen)
    loop.abort("r9")
    loop.run(lambda: False)
    assert len(seen) > count and seen[-1].num_running == 0 and seen[-1].num_blocks_used == 0
