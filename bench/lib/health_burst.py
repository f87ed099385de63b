"""`bench/load.py health-latency --burst N`: N simultaneous Health.Check calls from --channels
channels, in a separate process (as probes come from outside), each with the kubelet's 1 s
timeout (a long --timeout measures capacity instead). Every burst prints its p50, p99, max
and errors by code; the last line sums them.

Latency is per call, from just before that call starts (what its deadline counts from), so
the client's own time to issue N calls is not charged to the server; `wall_ms` is the whole
burst, first call to last answer; `srv_cpu`, `hp_cpu` and `cli_cpu` the CPU time the model
server, its health process (--health-port; 0 without one) and the client process spent
meanwhile (on a 2-core box their sum bounds what a burst can take).

Several targets (`main` and `health`: the main port and the health process's port of one
server) take turns, burst by burst, so both see the same machine; each gets its summary line.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
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


# (model server, health process) CPU seconds so far.
CpuSampler = Callable[[], tuple[float, float]]


def in_process_cpu() -> tuple[float, float]:
    """The server runs in this process (and has no health process)."""
    return time.process_time(), 0.0


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def processes_cpu(server_pid: int, health_pid: int) -> CpuSampler:
    return lambda: (process_cpu_s(server_pid), process_cpu_s(health_pid))


def _line(name: str, latencies: list[float], errors: Counter[str], wall_s: float,
          cpu_s: tuple[float, float, float]) -> str:
    ms = [v * 1e3 for v in latencies]
    codes = ", ".join(f"{k} {v}" for k, v in sorted(errors.items())) or "none"
    return (f"{name:<9} {len(ms):>6} {percentile(ms, 50):>8.1f} {percentile(ms, 99):>8.1f} "
            f"{max(ms, default=float('nan')):>8.1f} {wall_s * 1e3:>8.0f} "
            f"{cpu_s[0] * 1e3:>8.0f} {cpu_s[1] * 1e3:>8.0f} {cpu_s[2] * 1e3:>8.0f}  errors "
            f"{sum(errors.values())} ({codes})")


@dataclass
class _Totals:
    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    wall_s: float = 0.0
    cpu_s: tuple[float, float, float] = (0.0, 0.0, 0.0)
    met: bool = True


def run_bursts(targets: str | Sequence[tuple[str, str]], num_calls: int, num_channels: int,
               repeats: int, timeout_s: float = PROBE_TIMEOUT_S,
               cpu: CpuSampler = in_process_cpu) -> bool:
    """Print one line per burst and a total per target; True when every burst met the goal.
    `targets`: one address, or (name, address) pairs that take turns; `cpu` samples the
    server's processes (default: the server runs in this process)."""
    named = [("", targets)] if isinstance(targets, str) else list(targets)
    ctx = mp.get_context("spawn")  # a fresh interpreter: no torch, no inherited threads
    print(f"health burst: {num_calls} simultaneous Checks over {num_channels} channels, "
          f"{timeout_s:g} s timeout each, {repeats} bursts"
          + (f" per target ({', '.join(f'{n} {t}' for n, t in named)}, in turn)"
             if len(named) > 1 or named[0][0] else ""))
    print(f"{'burst':<9} {'ok':>6} {'p50_ms':>8} {'p99_ms':>8} {'max_ms':>8} {'wall_ms':>8} "
          f"{'srv_cpu':>8} {'hp_cpu':>8} {'cli_cpu':>8}")
    totals = {name: _Totals() for name, _ in named}
    for i in range(repeats):
        for name, target in named:
            out = ctx.Queue()
            proc = ctx.Process(target=_burst_process,
                               args=(target, num_calls, num_channels, timeout_s, out))
            proc.start()
            # Server CPU from the child's start: its connections and warm-up Checks included.
            before = cpu()
            latencies, errors, wall_s, client_cpu = out.get(timeout=120)
            after = cpu()
            proc.join(10)
            errors = Counter(errors)
            used = (after[0] - before[0], after[1] - before[1], client_cpu)
            print(_line(f"{name} {i + 1}".strip(), latencies, errors, wall_s, used))
            t = totals[name]
            t.latencies += latencies
            t.errors += errors
            t.wall_s += wall_s
            t.cpu_s = (t.cpu_s[0] + used[0], t.cpu_s[1] + used[1], t.cpu_s[2] + used[2])
            t.met = t.met and not errors and percentile(latencies, 99) * 1e3 < GOAL_P99_MS
    for name, t in totals.items():  # time and CPU: sums
        print(_line(f"{name} all".strip(), t.latencies, t.errors, t.wall_s, t.cpu_s))
    for name, t in totals.items():
        print(f"goal every burst 0 errors and p99 < {GOAL_P99_MS:.0f} ms"
              f"{' ' + name if name else ''}: {'MET' if t.met else 'NOT MET'}")
    return all(t.met for t in totals.values())
