"""Issue 16 item 9: CUDA-graph misses are proven, on the CPU, with a fake graph table that
captured only some sizes: a uniform decode above them runs eagerly and is counted (monitor,
metric, GetStatus), and --strict-jit=fail treats a miss after ready like a compile."""

from __future__ import annotations

import asyncio
import urllib.request
from typing import Any

import torch
from grpc_health.v1 import health_pb2

from tests.grpc_harness import eventually, run, server_config, serving
from tests.runner_helpers import MiniScheduler, make_runner, prompt
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.server.jit import JitMonitor, StrictJitPolicy
from warmgate.server.runner.attention.base import AttentionMetadata
from warmgate.server.runner.step_shape import UNIFORM, StepShape
from warmgate.server.runner.step_staging import StepViews
from warmgate.server.telemetry.metrics import Metrics

NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class PartialGraphTable:
    """Stands in for CudaGraphRunner with graphs for batches of up to `largest` requests: a
    hit runs the forward (eagerly, there is no GPU), a bigger uniform decode finds none."""

    captured = True

    def __init__(self, runner: Any, largest: int) -> None:
        self._runner, self._largest = runner, largest
        self.hits = 0

    def shape_for(self, num_reqs: int, num_tokens: int, uniform: bool) -> StepShape | None:
        if not uniform or num_reqs > self._largest:
            return None
        return StepShape(UNIFORM, num_tokens, num_reqs)  # each size captured: no padding

    def replay(self, shape: StepShape, views: StepViews) -> torch.Tensor:
        self.hits += 1
        meta = AttentionMetadata(
            num_reqs=shape.num_reqs, num_tokens=shape.num_tokens, max_query_len=1,
            max_seq_len=self._runner.max_model_len, query_start_loc=views.query_start_loc.gpu,
            seq_lens=views.seq_lens.gpu, block_table=views.block_table.gpu,
            slot_mapping=views.slot_mapping.gpu, positions=views.positions.gpu,
            query_start_loc_cpu=views.query_start_loc.cpu, seq_lens_cpu=views.seq_lens.cpu,
            block_table_cpu=views.block_table.cpu, is_uniform_decode=True)
        self._runner.attention_backend.plan(meta)
        return self._runner._eager_forward(views.input_ids.gpu, views.positions.gpu, meta)


def _decode_batch(runner: Any, num_reqs: int, tag: str) -> None:
    """Prefill num_reqs requests, then one uniform decode step over all of them."""
    sched = MiniScheduler(runner)
    for i in range(num_reqs):
        sched.add(f"{tag}{i}", prompt(5, offset=i))
    sched.step()
    sched.step()


def test_a_decode_above_the_captured_sizes_is_a_miss_after_ready() -> None:
    runner = make_runner(max_num_seqs=8)
    monitor: JitMonitor = runner.jit_monitor
    metrics = Metrics()
    monitor.add_listener(metrics.observe_jit)
    reasons: list[str] = []
    monitor.add_listener(StrictJitPolicy("fail", reasons.append))
    table = PartialGraphTable(runner, largest=2)
    runner.graph_runner = table  # type: ignore[assignment]
    monitor.mark_ready()
    _decode_batch(runner, 2, "hit")
    assert table.hits == 1 and monitor.snapshot().graph_misses_after_ready == 0
    assert reasons == []
    _decode_batch(runner, 4, "miss")
    counts = monitor.snapshot()
    assert counts.graph_misses == counts.graph_misses_after_ready == 1
    assert metrics.graph_misses.labels(after_ready="true", rank="0")._value.get() == 1
    assert len(reasons) == 1 and "CUDA-graph miss after ready" in reasons[0]
    assert "uniform_decode batch num_reqs=4" in reasons[0]


def test_a_miss_before_ready_is_counted_apart_and_never_fails() -> None:
    runner = make_runner(max_num_seqs=8)
    reasons: list[str] = []
    runner.jit_monitor.add_listener(StrictJitPolicy("fail", reasons.append))
    runner.graph_runner = PartialGraphTable(runner, largest=1)  # type: ignore[assignment]
    _decode_batch(runner, 3, "early")
    counts = runner.jit_monitor.snapshot()
    assert counts.graph_misses == 1 and counts.graph_misses_after_ready == 0
    assert reasons == []


def _scrape(port: int | None) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def test_graph_misses_reach_get_status_metrics_and_strict_jit() -> None:
    async def body() -> None:
        config = server_config("--max-num-seqs", "4", "--strict-jit", "fail")
        async with serving(config) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels(timeout=120)
            assert (await c.get_status()).cuda_graph_misses_after_ready == 0
            assert 'warmgate_cuda_graph_misses_total{after_ready="true",rank="0"} 0.0' in _scrape(
                s.metrics_port)
            loop = s.generation.serving_loop
            assert loop is not None
            loop.runner.graph_runner = PartialGraphTable(loop.runner, largest=1)

            async def one(i: int) -> None:
                async for _ in c.generate(prompt(6, offset=i), max_tokens=4):
                    pass

            # Four streams decode side by side: a uniform batch above the one captured size.
            await asyncio.gather(*(one(i) for i in range(4)), return_exceptions=True)
            status = await c.get_status()
            assert status.cuda_graph_misses_after_ready >= 1
            assert ('warmgate_cuda_graph_misses_total{after_ready="true",rank="0"} 0.0'
                    not in _scrape(s.metrics_port))
            await eventually(lambda: not s.controller.serving)
            assert await c.health() == NOT_SERVING
            status = await c.get_status()
            assert "CUDA-graph miss after ready" in status.failure_reason

    run(body(), timeout=180)

