"""The metrics port caps its connections (--metrics-max-connections) and closes idle ones
(--metrics-idle-timeout): hundreds of idle connections cost at most the cap in threads of
the gRPC front process, health keeps answering while they come and go, the ones past the
cap get a 503 naming the flag, and a scrape works again once the idle ones timed out.
Uncapped, 3,000 idle connections were 3,026 threads, and closing them pushed a health Check
past its 5 s deadline."""

from __future__ import annotations

import asyncio
import http.client
import socket
import threading
import time

import pytest

from tests.grpc_harness import FakeEngine, run, server_config, serving
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.server.config.server_config import (
    METRICS_IDLE_TIMEOUT_S,
    METRICS_MAX_CONNECTIONS,
)
from warmgate.server.startup import load_server_config

SERVING = 1  # grpc.health.v1 SERVING
CAP = 4
IDLE_S = 0.5
IDLE = 300
HEALTH_S = 1.0  # far under the 5 s deadline a probe gives, on a loaded 2-core machine


def _scrape(port: int) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/metrics")
        reply = conn.getresponse()
        return reply.status, reply.read().decode()
    finally:
        conn.close()


def _connection_threads() -> int:
    """The metrics server's connection threads (socketserver names them by their target)."""
    return sum("process_request_thread" in t.name for t in threading.enumerate())


def _idle_connections(port: int, count: int) -> list[socket.socket]:
    """`count` connections that never send a byte."""
    return [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(count)]


async def _health_latency(client: AsyncWarmgateClient) -> float:
    start = time.perf_counter()
    assert await client.health(timeout=5) == SERVING
    return time.perf_counter() - start


def test_idle_metrics_connections_are_capped_and_timed_out() -> None:
    async def body() -> None:
        config = server_config("--metrics-max-connections", str(CAP),
                               "--metrics-idle-timeout", str(IDLE_S))
        async with serving(config, engine=FakeEngine()) as s, \
                AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()
            assert s.metrics_endpoint is not None and s.metrics_port is not None
            port, endpoint = s.metrics_port, s.metrics_endpoint
            assert _connection_threads() == 0
            idle = await asyncio.to_thread(_idle_connections, port, IDLE)
            try:
                assert await _health_latency(c) < HEALTH_S
                # The first CAP are held, each by a thread; the rest were refused and closed.
                assert endpoint.open_connections <= CAP
                assert _connection_threads() <= CAP, threading.enumerate()
                status, text = await asyncio.to_thread(_scrape, port)
                if endpoint.open_connections == CAP:  # not timed out yet on a slow machine
                    assert status == 503 and f"(--metrics-max-connections {CAP})" in text, \
                        (status, text)
                # Past the idle timeout the held ones are closed, and a scrape is served.
                deadline = time.monotonic() + 10
                while endpoint.open_connections:
                    assert time.monotonic() < deadline, endpoint.open_connections
                    await asyncio.sleep(0.05)
                status, text = await asyncio.to_thread(_scrape, port)
                assert status == 200 and "warmgate_ready 1.0" in text, status
            finally:
                for sock in idle:  # all at once: health must not notice
                    sock.close()
            assert await _health_latency(c) < HEALTH_S
            deadline = time.monotonic() + 10
            while _connection_threads():
                assert time.monotonic() < deadline, threading.enumerate()
                await asyncio.sleep(0.05)

    run(body(), 60)


def test_the_limits_are_flags_with_defaults() -> None:
    config = server_config()
    assert (config.metrics_max_connections, config.metrics_idle_timeout_s) == \
        (METRICS_MAX_CONNECTIONS, METRICS_IDLE_TIMEOUT_S)
    config = load_server_config(["--metrics-max-connections", "2", "--metrics-idle-timeout",
                                 "3.5"], environ={})
    assert (config.metrics_max_connections, config.metrics_idle_timeout_s) == (2, 3.5)
    for flags in (["--metrics-max-connections", "0"], ["--metrics-idle-timeout", "nan"]):
        with pytest.raises(SystemExit) as info:
            load_server_config(flags, environ={})
        assert info.value.code == 2
