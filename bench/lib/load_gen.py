"""Generate load: replay a seeded workload of streaming requests and measure, on the client,
time to first token, inter-token latency, end-to-end latency, errors and throughput.

Usage: python bench/serve.py load-gen [--target host:port | --server-args "--model tiny ..."]
       [--num-requests 64] [--rate inf] [--concurrency C] [--prompt-len fixed:128]
       [--output-len fixed:64] [--temperature 0] [--seed 0] [--vocab V] [--repetitive] [--json]

Without --target a real server (create_server, as warmgate-server runs it) starts in this
process on a loop thread, from `--server-args` (warmup on start unless they say otherwise),
and the bench waits for health SERVING before the first request. The client is grpc.aio on
the main thread, one channel, every stream on it; in-process, client and server share the
GIL, so on a small CPU box the client's own cost shows up in the latencies (use --target
against a separate `warmgate-server` for cleaner numbers).

Arrivals are Poisson at --rate requests/s (inf: all at time 0); --concurrency caps the
streams in flight (a request that arrives while the cap is reached waits, and its clock starts
when it is sent). TTFT runs from sending the request to the first message with tokens; ITL is
the gap between messages divided by the later message's tokens, once per token; e2e runs to
the end of the stream. Throughput is output tokens over the wall time from the first send to
the last finish. Preemptions and draft acceptance come from the final messages' usage.
Exit status 1 when any request failed (the table counts them by status code).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import shlex
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from warmgate.server.devtools.load_stats import RequestResult, Summary, format_table, summarize
from warmgate.server.devtools.workload import (
    RequestSpec,
    build_workload,
    parse_distribution,
    parse_rate,
)

DEFAULT_VOCAB = 512  # the tiny preset's; with --target the bench cannot ask the server
READY_TIMEOUT_S = 600.0


# -- the in-process server ------------------------------------------------------------------

class InProcessServer:
    """create_server on its own event loop thread; `flags` are warmgate-server's."""

    def __init__(self, flags: Sequence[str]) -> None:
        from warmgate.server.app import create_server
        from warmgate.server.startup import load_server_config

        # Loopback, a free port, no metrics endpoint; the caller's flags come after, so they
        # win (argparse keeps the last value).
        self.config = load_server_config(["--host", "127.0.0.1", "--port", "0",
                                          "--metrics-port", "-1", *flags], environ={})
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="warmgate-server-loop")
        self._thread.start()
        self.running = asyncio.run_coroutine_threadsafe(create_server(self.config),
                                                         self._loop).result(READY_TIMEOUT_S)
        self.target = f"127.0.0.1:{self.running.port}"

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.running.stop(0, wait_for_runner=True),
                                         self._loop).result(120)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def wait_ready(target: str, timeout: float) -> float:
    """Block until health is SERVING; returns the seconds it took. SystemExit otherwise."""
    from warmgate.client.api import WaitResult, WarmgateClient

    start = time.perf_counter()
    with WarmgateClient(target, timeout=timeout) as client:
        result = client.wait_ready(timeout)
        if result is WaitResult.TIMEOUT:
            raise SystemExit(f"server at {target} not ready within {timeout:g} s")
        if result is WaitResult.FAILED:
            reason = client.get_status().failure_reason or "no failure reason"
            raise SystemExit(f"server at {target}: warmup failed: {reason}")
    return time.perf_counter() - start


# -- the client -----------------------------------------------------------------------------

async def _one(client: Any, spec: RequestSpec, start: float, gate: asyncio.Semaphore | None,
               temperature: float, timeout: float | None, ignore_eos: bool) -> RequestResult:
    from warmgate.client.errors import WarmgateRpcError
    from warmgate.v1 import generate_pb2 as gen_pb

    await asyncio.sleep(max(0.0, start + spec.arrival_s - time.perf_counter()))
    async with gate if gate is not None else contextlib.nullcontext():
        result = RequestResult(spec.index, sent_s=time.perf_counter())
        # A seed only matters when sampling; greedy requests stay on the plain sampler path.
        seed = spec.seed if temperature > 0 else None
        try:
            async for message in client.generate(
                    spec.prompt_token_ids, timeout=timeout, temperature=temperature,
                    seed=seed, max_tokens=spec.max_tokens, request_id=f"load-{spec.index}",
                    ignore_eos=ignore_eos):
                now = time.perf_counter()
                if message.token_ids:
                    result.messages.append((now, len(message.token_ids)))
                if message.finish_reason != gen_pb.FINISH_REASON_UNSPECIFIED:
                    result.finish_reason = gen_pb.FinishReason.Name(message.finish_reason)
                    usage = message.usage
                    result.num_preemptions = usage.num_preemptions
                    result.num_draft_tokens = usage.num_draft_tokens
                    result.num_accepted_draft_tokens = usage.num_accepted_draft_tokens
        except WarmgateRpcError as exc:
            result.error = exc.code.name
        result.finish_s = time.perf_counter()
    return result


async def run_load(target: str, specs: Sequence[RequestSpec], *,
                   concurrency: int | None = None, temperature: float = 0.0,
                   timeout: float | None = None, ignore_eos: bool = False,
                   connected: Callable[[], None] | None = None) -> list[RequestResult]:
    """Replay `specs` against `target`; one result per spec, in spec order. With
    `ignore_eos` every stream runs to its max_tokens (fixed output lengths). `connected`
    runs once the channel is up, before the clock starts (client_processes' barrier)."""
    from warmgate.client.aio import AsyncWarmgateClient

    gate = asyncio.Semaphore(concurrency) if concurrency else None
    async with AsyncWarmgateClient(target, timeout=timeout) as client:
        # Connect before the clock starts, so the first request does not pay the handshake.
        await client.health(timeout=30, wait_for_ready=True)
        if connected is not None:
            connected()
        start = time.perf_counter()
        return list(await asyncio.gather(*(_one(client, spec, start, gate, temperature, timeout,
                                                ignore_eos) for spec in specs)))


# -- the command ----------------------------------------------------------------------------

def typed(parse: Any) -> Any:
    """argparse type from a parser raising ValueError, keeping its message."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__
    return convert


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"{text!r}: must be >= 0")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"{text!r}: must be >= 1")
    return value


def add_workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-requests", type=typed(positive_int), default=64)
    p.add_argument("--rate", type=typed(parse_rate), default=math.inf,
                   help="Poisson arrivals, requests/s; inf (default) sends all at once")
    p.add_argument("--concurrency", type=typed(positive_int), default=None,
                   help="most streams in flight (default: no cap)")
    p.add_argument("--prompt-len", type=typed(parse_distribution),
                   default=parse_distribution("fixed:128"),
                   help="fixed:N, uniform:LO:HI or normal:MEAN:STD (default fixed:128)")
    p.add_argument("--output-len", type=typed(parse_distribution),
                   default=parse_distribution("fixed:64"),
                   help="max_tokens per request, same forms (default fixed:64)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0, help="the workload's and the requests' seeds")
    p.add_argument("--vocab", type=typed(positive_int), default=None,
                   help=f"token ids in [0, V) (default: the spawned server's model, else "
                        f"{DEFAULT_VOCAB})")
    p.add_argument("--repetitive", action="store_true",
                   help="prompts repeat a short random motif (an n-gram drafter finds it)")
    p.add_argument("--timeout", type=float, default=None, help="per-request deadline (s)")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default=None,
                   help="host:port of a running server (default: start one in-process)")
    p.add_argument("--server-args", default="",
                   help="warmgate-server flags for the in-process server, one string")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="with --target: cut requests to fit this context (default: the "
                        "spawned server's, else no cut)")
    p.add_argument("--ready-timeout", type=float, default=READY_TIMEOUT_S)
    add_workload_args(p)
    p.add_argument("--json", action="store_true",
                   help="print one JSON object on stdout (the table goes to stderr)")
    return p


@dataclass
class LoadReport:
    summary: Summary
    setup: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {**self.setup, **self.summary.to_dict()}


def run(args: argparse.Namespace, target: str, vocab: int,
        max_model_len: int | None) -> LoadReport:
    specs = build_workload(args.num_requests, rate=args.rate, prompt_len=args.prompt_len,
                           output_len=args.output_len, vocab=vocab, seed=args.seed,
                           repetitive=args.repetitive, max_model_len=max_model_len)
    results = asyncio.run(run_load(target, specs, concurrency=args.concurrency,
                                   temperature=args.temperature, timeout=args.timeout))
    setup = {"target": target, "num_requests": args.num_requests,
             "rate": None if math.isinf(args.rate) else args.rate,
             "concurrency": args.concurrency, "prompt_len": str(args.prompt_len),
             "output_len": str(args.output_len), "temperature": args.temperature,
             "seed": args.seed, "vocab": vocab, "repetitive": args.repetitive,
             "max_model_len": max_model_len}
    return LoadReport(summarize(results), setup)


def header(report: LoadReport, server: str) -> str:
    s = report.setup
    rate = "inf" if s["rate"] is None else f"{s['rate']:g}/s"
    return (f"load: {s['num_requests']} requests, rate {rate}, concurrency "
            f"{s['concurrency'] or 'unlimited'}, prompt {s['prompt_len']}, output "
            f"{s['output_len']}, temperature {s['temperature']:g}, seed {s['seed']}"
            f"{', repetitive' if s['repetitive'] else ''}; {server}")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    server: InProcessServer | None = None
    try:
        if args.target is None:
            server = InProcessServer(shlex.split(args.server_args))
            model = server.config.runner.model
            target, vocab = server.target, args.vocab or model.vocab_size
            max_model_len = args.max_model_len or model.max_model_len
            ready_s = wait_ready(target, args.ready_timeout)
            cfg = server.config.runner
            where = (f"in-process {model.name} on {cfg.device.device} "
                     f"({cfg.device.attention_backend}, k={cfg.speculative.num_speculative_steps}"
                     f"), ready after {ready_s:.1f} s")
        else:
            if args.server_args:
                raise SystemExit("--server-args configures the in-process server; with "
                                 "--target start the server yourself")
            target, vocab = args.target, args.vocab or DEFAULT_VOCAB
            max_model_len = args.max_model_len
            wait_ready(target, args.ready_timeout)
            where = f"server {target}"
        report = run(args, target, vocab, max_model_len)
    finally:
        if server is not None:
            server.close()
    text = header(report, where) + "\n" + format_table(report.summary)
    if args.json:
        print(text, file=sys.stderr)
        print(json.dumps(report.to_dict()))
    else:
        print(text)
    return 0 if report.summary.num_ok == report.summary.num_requests else 1


if __name__ == "__main__":
    sys.exit(main())
