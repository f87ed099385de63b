"""Load and soak: many concurrent GetStatus and Health.Check calls during forced warmups, then
a soak; errors (the goal is 0), latency p50/p99/max, and the server's RSS around the soak.

Usage: python bench/load.py soak [--concurrency 1000]
       [--burst-per-client 5] [--soak 10000] [--channels 4] [-- extra warmgate-server flags]

The server is a real `warmgate-server` process (tiny model on the CPU unless flags say
otherwise), so its RSS is its own and its event loop competes with nobody's. The clients are
grpc.aio tasks in this process spread over a few channels, each with many calls in flight:
1. burst: --concurrency clients each make --burst-per-client calls (alternating GetStatus
   and Health.Check) while another channel runs WarmupKernels(force=True) back to back;
2. soak: the same clients make --soak calls in all, no warmup running.
Loopback only; every phase has a time budget, so the whole run ends in under 90 s.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from warmgate.server.core.stats import percentile
from warmgate.server.devtools.server_process import ServerProcess

CALL_TIMEOUT_S = 10.0
PHASE_BUDGET_S = 35.0  # per phase; two phases plus start-up stay under 90 s


# -- the clients ----------------------------------------------------------------------------

@dataclass
class Samples:
    latency_s: dict[str, list[float]] = field(default_factory=lambda: {"GetStatus": [],
                                                                      "Health": []})
    errors: Counter[str] = field(default_factory=Counter)
    elapsed_s: float = 0.0

    @property
    def count(self) -> int:
        return sum(len(v) for v in self.latency_s.values()) + sum(self.errors.values())


async def _client(stubs: list[tuple[object, object]], index: int, calls: int,
                  samples: Samples) -> None:
    from warmgate.v1 import warmup_pb2 as pb

    warmup, health = stubs[index % len(stubs)]
    for i in range(calls):
        name = "GetStatus" if (index + i) % 2 == 0 else "Health"
        start = time.perf_counter()
        try:
            if name == "GetStatus":
                await warmup.GetStatus(pb.GetStatusRequest(),  # type: ignore[attr-defined]
                                       timeout=CALL_TIMEOUT_S)
            else:
                await health.Check(health_pb2.HealthCheckRequest(),  # type: ignore[attr-defined]
                                   timeout=CALL_TIMEOUT_S)
            samples.latency_s[name].append(time.perf_counter() - start)
        except grpc.aio.AioRpcError as exc:
            samples.errors[f"{name} {exc.code().name}"] += 1


async def _fan_out(channels: list[grpc.aio.Channel], concurrency: int, total: int
                   ) -> Samples:
    from warmgate.v1 import warmup_pb2_grpc as pb_grpc

    stubs = [(pb_grpc.WarmupStub(c), health_pb2_grpc.HealthStub(c)) for c in channels]
    samples = Samples()
    per, extra = divmod(total, concurrency)
    tasks = [_client(stubs, i, per + (i < extra), samples) for i in range(concurrency)]
    start = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*tasks), PHASE_BUDGET_S)
    samples.elapsed_s = time.perf_counter() - start
    return samples


async def _warm_loop(target: str, stop: asyncio.Event, outcomes: Counter[str]) -> None:
    from warmgate.v1 import warmup_pb2 as pb
    from warmgate.v1 import warmup_pb2_grpc as pb_grpc

    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.WarmupStub(channel)
        while not stop.is_set():
            try:
                report = await stub.WarmupKernels(pb.WarmupKernelsRequest(force=True),
                                                  timeout=120)
                outcomes[pb.WarmupOutcome.Name(report.outcome)] += 1
            except grpc.aio.AioRpcError as exc:
                outcomes[exc.code().name] += 1


@dataclass
class LoadResult:
    burst: Samples
    soak: Samples
    warmups: Counter[str]
    rss_before_mib: float
    rss_after_mib: float

    @property
    def errors(self) -> int:
        return sum(self.burst.errors.values()) + sum(self.soak.errors.values())


async def run_load(server: ServerProcess, *, concurrency: int, burst_per_client: int,
                   soak: int, channels: int) -> LoadResult:
    from warmgate.v1 import warmup_pb2 as pb
    from warmgate.v1 import warmup_pb2_grpc as pb_grpc

    target = f"127.0.0.1:{server.port}"
    pool = [grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
            for _ in range(channels)]  # a subchannel each: separate HTTP/2 connections
    try:
        first = pb_grpc.WarmupStub(pool[0])
        await first.WarmupKernels(pb.WarmupKernelsRequest(), timeout=120, wait_for_ready=True)
        stop, warmups = asyncio.Event(), Counter[str]()
        warming = asyncio.ensure_future(_warm_loop(target, stop, warmups))
        burst = await _fan_out(pool, concurrency, concurrency * burst_per_client)
        stop.set()
        await asyncio.wait_for(warming, 120)
        before = server.rss_mib()
        soaked = await _fan_out(pool, concurrency, soak)
        after = server.rss_mib()
    finally:
        for channel in pool:
            await channel.close()
    return LoadResult(burst, soaked, warmups, before, after)


# -- the table ------------------------------------------------------------------------------

def table(result: LoadResult) -> str:
    lines = [f"{'phase':<7} {'method':<10} {'requests':>8} {'errors':>6} {'p50_ms':>8} "
             f"{'p99_ms':>8} {'max_ms':>8}"]
    rates = []
    for phase, samples in (("burst", result.burst), ("soak", result.soak)):
        rates.append(f"{phase} {samples.count / samples.elapsed_s:.0f} req/s "
                     f"({samples.count} in {samples.elapsed_s:.2f} s)")
        for method, lat in samples.latency_s.items():
            errors = sum(n for k, n in samples.errors.items() if k.startswith(method))
            ms = [v * 1e3 for v in lat]
            lines.append(f"{phase:<7} {method:<10} {len(ms) + errors:>8} {errors:>6} "
                         f"{percentile(ms, 50):>8.2f} {percentile(ms, 99):>8.2f} "
                         f"{max(ms, default=float('nan')):>8.2f}")
    # With every client's next call queued behind the last, latency is mostly queueing:
    # about concurrency / throughput (Little's law), whoever the bottleneck is.
    lines.append("throughput: " + "; ".join(rates))
    warm = ", ".join(f"{k} {v}" for k, v in sorted(result.warmups.items())) or "none finished"
    lines.append(f"forced warmups during the burst: {warm}")
    lines.append(f"server RSS: {result.rss_before_mib:.1f} MiB before the soak, "
                 f"{result.rss_after_mib:.1f} MiB after "
                 f"({result.rss_after_mib - result.rss_before_mib:+.1f} MiB)")
    kinds = dict(result.burst.errors + result.soak.errors)
    lines.append(f"errors: {result.errors} {kinds if kinds else '(none)'}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, default=1000)
    parser.add_argument("--burst-per-client", type=int, default=5)
    parser.add_argument("--soak", type=int, default=10_000, help="requests in the soak")
    parser.add_argument("--channels", type=int, default=4)
    parser.add_argument("server_flags", nargs="*", help="more warmgate-server flags (after --)")
    args = parser.parse_args(argv)
    if not 1 <= args.concurrency <= 2000 or not 1 <= args.channels <= 64:
        parser.error("--concurrency must be in [1, 2000] and --channels in [1, 64]")
    if args.concurrency * args.burst_per_client > 20_000 or args.soak > 50_000:
        parser.error("keep the run bounded: burst <= 20,000 and --soak <= 50,000 requests")
    started = time.monotonic()
    with ServerProcess(["--no-warmup-on-start", *args.server_flags],
                       stop_signal=signal.SIGTERM) as server:
        result = asyncio.run(run_load(server, concurrency=args.concurrency,
                                      burst_per_client=args.burst_per_client, soak=args.soak,
                                      channels=args.channels))
    print(f"load_soak: {args.concurrency} concurrent clients on {args.channels} channels; "
          f"burst {args.concurrency * args.burst_per_client} requests during forced warmups, "
          f"soak {args.soak}; {time.monotonic() - started:.1f} s in all")
    print(table(result))
    return 0 if result.errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
