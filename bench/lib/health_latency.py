"""Health.Check latency while idle vs while kernels warm up (the kubelet's probe timeout is 1 s).

Usage: python bench/load.py health-latency [--seconds 5] [--clients 50]
       [--model tiny] [--device auto] [--interval 0.02] [-- extra warmgate-server flags]
       python bench/load.py health-latency --burst 3000 [--channels 10]
       [--repeats 3] [--health-port]    (simultaneous Checks instead: bench/lib/health_burst.py)

A real server (the real runner, warmup not on start) runs in this process on a loop thread,
exactly as warmgate-server runs it. The probes run in a separate process, as the kubelet
does: `--clients` concurrent aio channels, each calling Health.Check, pausing `--interval`
between calls. After `--seconds` idle this process sends WarmupKernels(force=True) over gRPC
back to back for another `--seconds`: one plan of the tiny model on a CPU takes tens of
milliseconds, so the loop keeps the worker thread busy for the whole window (on a GPU, pass
a bigger preset, e.g. `--model llama-3.2-1b -- --max-model-len 2048`, and fewer loops run).
A probe counts as "during" when it started while a warmup call was in flight.
Loopback only; bounded to about 2 x --seconds plus start-up.

`--burst N --health-port`: a real `warmgate-server` process (devtools.ServerProcess, as a
kubelet sees it) with `--health-port 0`, warmed up; bursts on its main port and on its health
process's port take turns, and each line gives the CPU of the model server and of the health
process. `--during-warmup` keeps the model server busy meanwhile: forced warmups back to back
(health answers NOT_SERVING during them: an answer all the same).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from health_burst import PROBE_TIMEOUT_S, processes_cpu, run_bursts
from load_gen import InProcessServer

from warmgate.server.core.stats import percentile

GOAL_P99_MS = 50.0


# -- the probe process ------------------------------------------------------------------

async def _probe_loop(target: str, until: float, interval: float,
                      samples: list[tuple[float, float]], errors: list[str]) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    async with grpc.aio.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service="")
        await stub.Check(request, timeout=10, wait_for_ready=True)  # connect before timing
        while time.monotonic() < until:
            start = time.monotonic()
            try:
                await stub.Check(request, timeout=PROBE_TIMEOUT_S)
                samples.append((start, time.monotonic() - start))
            except grpc.aio.AioRpcError as exc:
                errors.append(exc.code().name)
            await asyncio.sleep(interval)


def probe_main(target: str, until: float, clients: int, interval: float, out: Any) -> None:
    samples: list[tuple[float, float]] = []
    errors: list[str] = []

    async def run() -> None:
        await asyncio.gather(*(_probe_loop(target, until, interval, samples, errors)
                               for _ in range(clients)))

    asyncio.run(run())
    out.put((samples, errors))


def _warm_for(target: str, seconds: float) -> tuple[list[tuple[float, float]], list[float]]:
    """Forced warmups back to back for `seconds`; returns their windows and durations."""
    from warmgate.client.api import WarmgateClient

    windows: list[tuple[float, float]] = []
    durations: list[float] = []
    with WarmgateClient(target, timeout=600) as client:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            start = time.monotonic()
            report = client.warmup_kernels(force=True)
            windows.append((start, time.monotonic()))
            durations.append(report.total_duration.ToNanoseconds() / 1e9)
    return windows, durations


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def _row(name: str, lat: list[float]) -> str:
    ms = [v * 1e3 for v in lat]
    return (f"{name:<8} {len(ms):>8} {percentile(ms, 50):>8.2f} {percentile(ms, 99):>8.2f} "
            f"{max(ms, default=float('nan')):>8.2f}")


def _burst_server_process(args: argparse.Namespace) -> int:
    from warmgate.client.api import WaitResult, WarmgateClient
    from warmgate.server.devtools.server_process import ServerProcess

    flags = ["--health-port", "0", "--model", args.model, *args.server_flags]
    device = None if args.device == "auto" else args.device
    with ServerProcess(flags, device=device, start_timeout_s=120) as server:
        with WarmgateClient(server.target, timeout=120) as client:
            if client.wait_ready(120) is not WaitResult.READY:
                raise SystemExit("the server did not get ready:\n" + server.log_tail())
        health = f"127.0.0.1:{server.health_port}"
        print(f"warmgate-server pid {server.proc.pid} (main port {server.port}), health "
              f"process pid {server.health_pid()} (port {server.health_port}); model "
              f"{args.model}" + ("; forced warmups back to back" if args.during_warmup else ""))
        stop = threading.Event()
        warming = threading.Thread(target=_warm_until, args=(server.target, stop), daemon=True)
        if args.during_warmup:
            warming.start()
        try:
            run_bursts([("main", server.target), ("health", health)], args.burst,
                       args.channels, args.repeats, args.timeout,
                       processes_cpu(server.proc.pid, server.health_pid()))
        finally:
            stop.set()
            if warming.is_alive():
                warming.join(120)
    return 0


def _warm_until(target: str, stop: threading.Event) -> None:
    from warmgate.client.api import WarmgateClient

    with WarmgateClient(target, timeout=600) as client:
        while not stop.is_set():
            client.warmup_kernels(force=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="idle and warmup windows")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--interval", type=float, default=0.02,
                        help="pause between one client's checks (s)")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--torch-threads", type=int, default=None,
                        help="torch intra-op threads in the server (default: torch's). On a "
                             "small CPU box, fewer leave a core for the event loop")
    parser.add_argument("--burst", type=int, default=0, metavar="N",
                        help="instead of the idle/warmup windows: N simultaneous Checks")
    parser.add_argument("--channels", type=int, default=10, help="channels of a --burst")
    parser.add_argument("--repeats", type=int, default=3, help="bursts, one after another")
    parser.add_argument("--timeout", type=float, default=PROBE_TIMEOUT_S,
                        help="each burst call's deadline (s); a long one measures capacity")
    parser.add_argument("--health-port", action="store_true",
                        help="with --burst: a warmgate-server process with --health-port; "
                             "its main port and health port in turn")
    parser.add_argument("--during-warmup", action="store_true",
                        help="with --health-port: forced warmups back to back during the "
                             "bursts")
    parser.add_argument("server_flags", nargs="*", help="more warmgate-server flags (after --)")
    args = parser.parse_args(argv)
    if args.burst < 0 or args.channels < 1 or args.repeats < 1 or not args.timeout > 0:
        parser.error("--burst must be >= 0, --channels and --repeats >= 1, --timeout > 0")
    if args.seconds * 2 > 50:
        parser.error("--seconds: keep the bench under a minute (at most 25)")

    if args.health_port:
        if not args.burst:
            parser.error("--health-port goes with --burst")
        return _burst_server_process(args)
    if args.torch_threads is not None:
        import torch

        torch.set_num_threads(args.torch_threads)
    server = InProcessServer(["--no-warmup-on-start", "--model", args.model, "--device",
                              args.device, *args.server_flags])
    try:
        from warmgate.client.api import WarmgateClient

        with WarmgateClient(server.target, timeout=120) as client:
            first = client.warmup_kernels()  # the cold plan (and the load) happen here
        if args.burst:
            run_bursts(server.target, args.burst, args.channels, args.repeats, args.timeout)
            return 0
        ctx = mp.get_context("spawn")  # a fresh interpreter: no torch, no inherited threads
        results = ctx.Queue()
        settle_s = 2.0  # the probe process's own start-up, excluded from both windows
        idle_from = time.monotonic() + settle_s
        until = idle_from + 2 * args.seconds
        probe = ctx.Process(target=probe_main, args=(server.target, until, args.clients,
                                                     args.interval, results))
        probe.start()
        time.sleep(max(0.0, idle_from + args.seconds - time.monotonic()))
        windows, durations = _warm_for(server.target, until - time.monotonic())
        samples, errors = results.get(timeout=60)
        probe.join(10)
    finally:
        server.close()

    def during(t: float) -> bool:
        return any(a <= t <= b for a, b in windows)

    idle = [lat for t, lat in samples if idle_from <= t < idle_from + args.seconds]
    busy = [lat for t, lat in samples if t >= idle_from + args.seconds and during(t)]
    p99_idle, p99_busy = percentile(idle, 99) * 1e3, percentile(busy, 99) * 1e3
    cfg = server.config.runner
    print(f"health latency: {args.clients} probing clients, {args.interval * 1e3:.0f} ms apart; "
          f"model {cfg.model.name} on {cfg.device.device} ({cfg.device.attention_backend}, "
          f"{_torch_threads()} torch threads); "
          f"cold plan {first.total_duration.ToNanoseconds() / 1e9:.3f} s")
    print(f"warmup window: {len(durations)} forced plans back to back, median "
          f"{statistics.median(durations) * 1e3:.1f} ms each" if durations else
          "warmup window: no plan finished")
    print(f"{'window':<8} {'samples':>8} {'p50_ms':>8} {'p99_ms':>8} {'max_ms':>8}")
    print(_row("idle", idle))
    print(_row("warmup", busy))
    print(f"ratio p99 warmup/idle: {p99_busy / p99_idle:.2f}x   "
          f"p50: {percentile(busy, 50) / percentile(idle, 50):.2f}x")
    print(f"errors: {len(errors)} ({', '.join(sorted(set(errors))) or 'none'})")
    ok = p99_busy <= GOAL_P99_MS and not errors
    print(f"goal p99 during warmup <= {GOAL_P99_MS:.0f} ms: {'MET' if ok else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
