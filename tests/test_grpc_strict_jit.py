"""--strict-jit against the real server: a compile after ready, caused by an RPC's batch,
turns health NOT_SERVING under `fail` and GetStatus says which batch compiled what. The serving
rehearsal is off here: whether its mixed step lands in the left-out bucket depends on timing
(tests/test_serving_rehearsal.py covers readiness lost while it runs)."""

from __future__ import annotations

import asyncio
import urllib.request

import pytest
from grpc_health.v1 import health_pb2

from tests.grpc_harness import run, server_config, serving
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.server.warmup import compile_phase
from warmgate.v1 import warmup_pb2 as pb

pytestmark = pytest.mark.slow

# Buckets 1, 2, 4, 8, 16 (as tests/test_compile_warmup.py, so inductor's cache is warm).
FLAGS = ("--compile", "--max-num-seqs", "2", "--max-num-batched-tokens", "16",
         "--max-model-len", "128", "--block-size", "16")
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _no_rehearsal() -> None:
    return None


def _leave_out_bucket_8(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the compile phase touches bucket 8; without it a MixedWarmup of 8 tokens (one
    decode beside a 7-token prefill) compiles after ready."""
    monkeypatch.setattr(compile_phase, "buckets_to_warm",
                        lambda runner: tuple(b for b in runner.compile_buckets if b != 8))


def _scrape(port: int | None) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def test_strict_jit_fail_turns_health_not_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    _leave_out_bucket_8(monkeypatch)

    async def body() -> None:
        config = server_config(*FLAGS, "--strict-jit", "fail")
        async with serving(config) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            s.controller.set_rehearsal(_no_rehearsal)
            report = await c.warmup_kernels(timeout=120)
            assert report.outcome == pb.WARMUP_OUTCOME_SUCCEEDED
            compiled = {p.name: dict(p.compiles) for p in report.phases}
            assert compiled["compile"]["dynamo"] == 8  # 4 buckets x 2 halves of a layer
            assert await c.health() == SERVING
            await c.mixed_warmup(8, timeout=60)
            for _ in range(200):  # health is set by a task the failure spawns
                if await c.health() == NOT_SERVING:
                    break
                await asyncio.sleep(0.01)
            assert await c.health() == NOT_SERVING
            assert await c.health("liveness") == SERVING  # not fatal: no restart
            status = await c.get_status()
            assert status.state == pb.WARMUP_STATE_FAILED
            assert "compile after ready: dynamo" in status.failure_reason
            assert "mixed batch num_reqs=2 num_tokens=8" in status.failure_reason
            text = await asyncio.to_thread(_scrape, s.metrics_port)
            assert ('warmgate_jit_compiles_total{after_ready="true",kind="dynamo",rank="0"} '
                    '2.0') in text
            assert ('warmgate_jit_compiles_total{after_ready="false",kind="dynamo",rank="0"} '
                    '8.0') in text
            # A forced re-warmup finds everything compiled and serves again.
            report = await c.warmup_kernels(force=True, timeout=120)
            assert report.outcome == pb.WARMUP_OUTCOME_SUCCEEDED
            assert await c.health() == SERVING

    run(body(), timeout=180)


def test_strict_jit_warn_keeps_serving_and_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    _leave_out_bucket_8(monkeypatch)

    async def body() -> None:
        async with serving(server_config(*FLAGS)) as s, \
                AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            s.controller.set_rehearsal(_no_rehearsal)
            await c.warmup_kernels(timeout=120)
            await c.mixed_warmup(8, timeout=60)
            await asyncio.sleep(0.05)
            assert await c.health() == SERVING
            assert (await c.get_status()).state == pb.WARMUP_STATE_READY
            text = await asyncio.to_thread(_scrape, s.metrics_port)
            assert ('warmgate_jit_compiles_total{after_ready="true",kind="dynamo",rank="0"} '
                    '2.0') in text

    run(body(), timeout=180)
