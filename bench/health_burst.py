"""`bench/health_latency.py --burst N`: N simultaneous Health.Check calls from --channels
channels, in a separate process (as probes come from outside), each with the kubelet's 1 s
timeout (a long --timeout measures capacity instead). Every burst prints its p50, p99, max
and errors by code; the last line sums them.

Latency is per call, from just before that call starts (what its deadline counts from), so
the client's own time to issue N calls is not charged to the server; `wall_ms` is the whole
burst, first call to last answer; `srv_cpu` and `cli_cpu` the CPU time the server and the
client process spent meanwhile (on a 2-core box their sum bounds what a burst can take).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from warmgate.server.core.stats import percentile

PROBE_TIMEOUT_S = 1.0  # the kubelet's default gRPC probe timeout
GOAL_P99_MS = 1000.0


@dataclass
class BurstResult:
    latencies_s: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    wall_s: float = 0.0
    cpu_s: float = 0.0  # the client process's own CPU time for the burst


async def _burst(target: str, num_calls: int, num_channels: int, timeout_s: float
                 ) -> BurstResult:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    channels = [grpc.aio.insecure_channel(target) for _ in range(num_channels)]
    try:
        stubs = [health_pb2_grpc.HealthStub(c) for c in channels]
        request = health_pb2.HealthCheckRequest(service="")
        # Connected before the burst: it measures calls, not connection set-up.
        await asyncio.gather(*(s.Check(request, timeout=30, wait_for_ready=True)
                               for s in stubs))
        result = BurstResult()

        async def one(stub: Any) -> None:
            start = time.monotonic()
            try:
                await stub.Check(request, timeout=timeout_s)
                result.latencies_s.append(time.monotonic() - start)
            except grpc.aio.AioRpcError as exc:
                result.errors[exc.code().name] += 1

        start, cpu = time.monotonic(), time.process_time()
        await asyncio.gather(*(one(stubs[i % num_channels]) for i in range(num_calls)))
        result.wall_s = time.monotonic() - start
        result.cpu_s = time.process_time() - cpu
        return result
    finally:
        await asyncio.gather(*(c.close() for c in channels))


def _burst_process(target: str, num_calls: int, num_channels: int, timeout_s: float,
                   out: Any) -> None:
    result = asyncio.run(_burst(target, num_calls, num_channels, timeout_s))
    out.put((result.latencies_s, dict(result.errors), result.wall_s, result.cpu_s))


def _line(name: str, latencies: list[float], errors: Counter[str], wall_s: float,
          cpu_s: tuple[float, float]) -> str:
    ms = [v * 1e3 for v in latencies]
    codes = ", ".join(f"{k} {v}" for k, v in sorted(errors.items())) or "none"
    return (f"{name:<7} {len(ms):>6} {percentile(ms, 50):>8.1f} {percentile(ms, 99):>8.1f} "
            f"{max(ms, default=float('nan')):>8.1f} {wall_s * 1e3:>8.0f} "
            f"{cpu_s[0] * 1e3:>8.0f} {cpu_s[1] * 1e3:>8.0f}  errors "
            f"{sum(errors.values())} ({codes})")


def run_bursts(target: str, num_calls: int, num_channels: int, repeats: int,
               timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Print one line per burst and a total; True when every burst met the goal. The server
    runs in this process: its CPU time over the burst is this process's."""
    ctx = mp.get_context("spawn")  # a fresh interpreter: no torch, no inherited threads
    print(f"health burst: {num_calls} simultaneous Checks over {num_channels} channels, "
          f"{timeout_s:g} s timeout each, {repeats} bursts")
    print(f"{'burst':<7} {'ok':>6} {'p50_ms':>8} {'p99_ms':>8} {'max_ms':>8} {'wall_ms':>8} "
          f"{'srv_cpu':>8} {'cli_cpu':>8}")
    all_latencies: list[float] = []
    all_errors: Counter[str] = Counter()
    total_wall_s, total_cpu_s = 0.0, (0.0, 0.0)
    met = True
    for i in range(repeats):
        out = ctx.Queue()
        proc = ctx.Process(target=_burst_process,
                           args=(target, num_calls, num_channels, timeout_s, out))
        proc.start()
        # Server CPU from the child's start: its connections and warm-up Checks included.
        server_cpu = time.process_time()
        latencies, errors, wall_s, client_cpu = out.get(timeout=120)
        server_cpu = time.process_time() - server_cpu
        proc.join(10)
        errors = Counter(errors)
        print(_line(str(i + 1), latencies, errors, wall_s, (server_cpu, client_cpu)))
        all_latencies += latencies
        all_errors += errors
        total_wall_s += wall_s
        total_cpu_s = (total_cpu_s[0] + server_cpu, total_cpu_s[1] + client_cpu)
        met = met and not errors and percentile(latencies, 99) * 1e3 < GOAL_P99_MS
    print(_line("all", all_latencies, all_errors, total_wall_s, total_cpu_s))  # time: sums
    print(f"goal every burst 0 errors and p99 < {GOAL_P99_MS:.0f} ms: "
          f"{'MET' if met else 'NOT MET'}")
    return met
