"""Where a small model's time to first token goes outside the step: the client's TTFT and the
server's own (arrival to first token) per request, before and after the two hops this
measures were removed, side by side in one run, with gRPC's own floor beside them.

Arms, each a real `warmgate-server` (engine process, CPU unless --server-args says otherwise)
timed by N sequential Generates, the arms taking turns in rounds so load drifts hit all alike:
  server RUN from worker   the front sends the engine its RUN from the runner worker thread,
                           after the hop to it (the server as it was: started through this
                           script with RunnerWorker.run_between_jobs dropping its `start`);
  server RUN from loop     the front sends RUN from the event loop, right behind the SUBMIT;
each with two clients on the same server:
  grpc default channel     grpc's synchronous channel: a call on an idle channel starts its
                           "channel spin" thread, and every message hops through it;
  warmgate channel         warmgate.client.security.sync_channel: streams are read on the
                           iterating thread (SingleThreadedUnaryStream).
Floor: a bare grpc.aio server in its own process whose Generate yields one message at once,
with each client: what gRPC alone costs a request on this host.

    python bench/serve.py ttft-path [--requests 60] [--rounds 6] [--max-tokens 1]
           [--server-args "--model tiny"]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import grpc
from first_request_generate import read_ttfts

from warmgate.client.api import WaitResult, WarmgateClient
from warmgate.client.generate import generate_request
from warmgate.client.security import ClientSecurity, sync_channel
from warmgate.server.devtools.server_process import ServerProcess
from warmgate.v1 import generate_pb2 as gen_pb
from warmgate.v1 import generate_pb2_grpc as gen_grpc

AS_SERVER_BEFORE = "--as-server-run-from-worker"
AS_FLOOR_SERVER = "--as-floor-server"
CHANNELS: dict[str, Callable[[str], grpc.Channel]] = {
    "grpc default channel": lambda target: grpc.insecure_channel(target),
    "warmgate channel": lambda target: sync_channel(target, ClientSecurity()),
}


def _server_run_from_worker() -> int:
    """The server with the engine's RUN sent from the runner worker thread, as before."""
    from warmgate.server.control.worker import RunnerWorker
    from warmgate.server.main import main

    run_between_jobs = RunnerWorker.run_between_jobs

    async def without_start(self: RunnerWorker, fn: Callable[[], None],
                            start: Callable[[], None] | None = None) -> None:
        await run_between_jobs(self, fn)  # run() then sends RUN itself, on the worker

    RunnerWorker.run_between_jobs = without_start  # type: ignore[method-assign]
    return main(sys.argv[2:])


def _floor_server() -> None:
    """A Generate that yields its one message at once: gRPC's cost and nothing else."""
    class Generation(gen_grpc.GenerationServicer):
        async def Generate(self, request: Any, context: Any) -> Any:
            message = gen_pb.GenerateResponse(token_ids=[1],
                                              finish_reason=gen_pb.FINISH_REASON_LENGTH)
            message.usage.time_to_first_token_s = 0.0
            yield message

    async def serve() -> None:
        server = grpc.aio.server()
        gen_grpc.add_GenerationServicer_to_server(Generation(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print(port, flush=True)
        await server.wait_for_termination()

    asyncio.run(serve())


@contextmanager
def floor_server() -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, __file__, AS_FLOOR_SERVER],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield f"127.0.0.1:{int(proc.stdout.readline())}"
    finally:
        proc.kill()
        proc.wait()


def warmgate_server(flags: list[str], run_from_worker: bool) -> ServerProcess:
    server = ServerProcess(flags, start_timeout_s=300, stop_signal=signal.SIGTERM)
    if run_from_worker:  # the same argv, run through this script's patched entry
        i = server.argv.index("-m")
        server.argv[i:i + 2] = [__file__, AS_SERVER_BEFORE]
    return server


def timed(stub: gen_grpc.GenerationStub, prompt: list[int], max_tokens: int
          ) -> tuple[float, float]:
    """(client TTFT, server TTFT) in ms, the stream read to its end."""
    start = time.perf_counter()
    first, server = read_ttfts(start, stub.Generate(
        generate_request(prompt, max_tokens=max_tokens, ignore_eos=True), timeout=60))
    return 1e3 * first, 1e3 * server


def row(name: str, samples: list[tuple[float, float]], floor: bool) -> str:
    def q(values: list[float]) -> str:
        deciles = statistics.quantiles(values, n=10)
        return (f"{statistics.median(values):6.2f} {deciles[0]:6.2f} {deciles[-1]:6.2f} "
                f"{max(values):6.2f}")

    client = [c for c, _ in samples]
    if floor:
        return f"{name:48s} {q(client)}"
    return (f"{name:48s} {q(client)}   {q([s for _, s in samples])}   "
            f"{q([c - s for c, s in samples])}")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == AS_SERVER_BEFORE:
        return _server_run_from_worker()
    if len(sys.argv) > 1 and sys.argv[1] == AS_FLOOR_SERVER:
        _floor_server()
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=60, help="per arm, in all rounds")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=1,
                        help="1: the engine steps no further while the first token travels "
                             "(on 2 cores a next step competes with the hops measured)")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--gap-s", type=float, default=0.05, help="idle before each request")
    parser.add_argument("--server-args", default="--model tiny")
    args = parser.parse_args()
    flags = shlex.split(args.server_args)
    rng = random.Random(0)
    per_round = max(1, args.requests // args.rounds)
    results: dict[str, list[tuple[float, float]]] = {}
    floor: dict[str, list[tuple[float, float]]] = {}
    with ExitStack() as stack:
        targets = {}
        for name, before in (("server RUN from worker", True), ("server RUN from loop", False)):
            server = stack.enter_context(warmgate_server(flags, before))
            with WarmgateClient(server.target, timeout=300) as client:
                if client.wait_ready(300) is not WaitResult.READY:
                    raise SystemExit(f"{name}: not ready\n{server.log_tail()}")
            targets[name] = server.target
        floor_target = stack.enter_context(floor_server())
        stubs = {}
        for server_name, target in [*targets.items(), ("grpc floor", floor_target)]:
            for channel_name, channel in CHANNELS.items():
                ch = stack.enter_context(channel(target))
                stub = gen_grpc.GenerationStub(ch)
                for _ in range(3):  # connected, each method's first call paid
                    timed(stub, [1, 2, 3], 1)
                stubs[f"{server_name}, {channel_name}"] = stub
        names = list(stubs)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                for _ in range(per_round):
                    time.sleep(args.gap_s)
                    prompt = [rng.randrange(256) for _ in range(args.prompt_len)]
                    sink = floor if name.startswith("grpc floor") else results
                    sink.setdefault(name, []).append(timed(stubs[name], prompt,
                                                           args.max_tokens))
    print(f"# {per_round * args.rounds} sequential Generates per arm ({args.rounds} rounds, "
          f"arms in turn), prompt {args.prompt_len} tokens, max_tokens {args.max_tokens}, "
          f"{args.gap_s * 1e3:.0f} ms idle before each; server: {args.server_args}")
    stat = "median    p10    p90    max"
    print(f"{'ms':48s} {'client TTFT':27s}   {'server TTFT':27s}   client - server")
    print(f"{'':48s} {stat}   {stat}   {stat}")
    for name, samples in results.items():
        print(row(name, samples, floor=False))
    print("gRPC floor (a handler that yields at once, in its own process): client TTFT")
    for name, samples in floor.items():
        print(row(name, samples, floor=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
