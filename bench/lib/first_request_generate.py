"""Generate on fresh `warmgate-server` processes, timed from the client: one request's time to
first token (client and server side), the first request after ready against steady ones, and
throughput at many streams. Used by first_request.py --mode ttft and bench/serve.py cpu-threads."""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import signal
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from load_gen import run_load

from warmgate.server.devtools.load_stats import Summary, summarize
from warmgate.server.devtools.server_process import ServerProcess
from warmgate.server.devtools.workload import build_workload, parse_distribution

START_TIMEOUT_S = 300.0  # process start to port bound (imports, argument checks)
POLL_S = 0.05  # GetStatus / UNAVAILABLE retry interval while waiting for the model
NO_WARMUP_FLAGS = ("--no-warmup-on-start", "--serve-before-ready")


def server_process(flags: Sequence[str], *, keep_caches: bool) -> ServerProcess:
    """A fresh server on the device its flags name (auto when none), stopped with SIGTERM
    (its graceful stop), with its own empty compile caches unless keep_caches."""
    return ServerProcess(flags, device=None, start_timeout_s=START_TIMEOUT_S,
                         stop_signal=signal.SIGTERM, fresh_caches=not keep_caches)


# -- TTFT -----------------------------------------------------------------------------------

@dataclass
class FirstResult:
    name: str
    # Process start to ready (health SERVING, or the model loaded without warmup).
    ready_s: float
    first_s: float
    # The first request's TTFT as the server measured it (arrival to first token).
    server_first_s: float
    repeats_s: list[float] = field(default_factory=list)
    server_repeats_s: list[float] = field(default_factory=list)
    # The same requests again with no gap between them.
    back_to_back_s: list[float] = field(default_factory=list)
    # Times Generate answered UNAVAILABLE before the first request was taken.
    retries: int = 0
    device: str = ""
    backend: str = ""

    @property
    def median_s(self) -> float:
        return statistics.median(self.repeats_s) if self.repeats_s else math.nan

    @property
    def ratio(self) -> float:
        return self.first_s / self.median_s

    @property
    def back_to_back_ratio(self) -> float:
        return self.first_s / statistics.median(self.back_to_back_s) if self.back_to_back_s \
            else math.nan

    @property
    def server_median_s(self) -> float:
        return statistics.median(self.server_repeats_s) if self.server_repeats_s else math.nan

    @property
    def server_ratio(self) -> float:
        return self.server_first_s / self.server_median_s

    def to_dict(self) -> dict[str, Any]:
        return {"ready_s": round(self.ready_s, 4), "first_s": round(self.first_s, 6),
                "server_first_s": round(self.server_first_s, 6),
                "median_s": round(self.median_s, 6), "ratio": round(self.ratio, 4),
                "repeats_s": [round(t, 6) for t in self.repeats_s],
                "server_median_s": round(self.server_median_s, 6),
                "server_ratio": round(self.server_ratio, 4),
                "server_repeats_s": [round(t, 6) for t in self.server_repeats_s],
                "back_to_back_s": [round(t, 6) for t in self.back_to_back_s],
                "back_to_back_ratio": round(self.back_to_back_ratio, 4),
                "retries": self.retries}


class TtftParts(NamedTuple):
    """One request's time to first token, in seconds: at the client, at the server (arrival
    to first token), and the server's queue (arrival to first scheduled step) inside it."""
    client: float
    server: float
    queue: float


def read_ttft_parts(start: float, messages: Iterable[Any]) -> TtftParts:
    """The TTFTs of a Generate stream started at perf_counter `start`, read to its end so
    the next request runs alone."""
    first: float | None = None
    server_ttft = queue = math.nan
    for message in messages:
        if first is None and message.token_ids:
            first = time.perf_counter() - start
        if message.HasField("usage"):
            server_ttft = message.usage.time_to_first_token_s
            queue = message.usage.queue_time_s
    if first is None:
        raise RuntimeError("the stream ended without a token")
    return TtftParts(first, server_ttft, queue)


def read_ttfts(start: float, messages: Iterable[Any]) -> tuple[float, float]:
    """(client TTFT, server TTFT) in seconds (read_ttft_parts)."""
    parts = read_ttft_parts(start, messages)
    return parts.client, parts.server


def timed_stream_parts(client: Any, prompt: list[int], max_tokens: int, timeout: float,
                       ignore_eos: bool = False) -> TtftParts:
    """The TTFTs of one request through a WarmgateClient."""
    start = time.perf_counter()
    return read_ttft_parts(start, client.generate(prompt, max_tokens=max_tokens,
                                                  timeout=timeout, ignore_eos=ignore_eos))


def timed_stream(client: Any, prompt: list[int], max_tokens: int, timeout: float,
                 ignore_eos: bool = False) -> tuple[float, float]:
    """(client TTFT, server TTFT) of one request through a WarmgateClient."""
    parts = timed_stream_parts(client, prompt, max_tokens, timeout, ignore_eos)
    return parts.client, parts.server


def _warm_client(client: Any) -> None:
    """One Generate with an empty prompt: the server refuses it (INVALID_ARGUMENT) before it
    reaches the scheduler or the runner, but the client's first call on the method (stub and
    call set-up in Python) is paid here, not by the timed first request, as a
    router's long-lived channel would have paid it long ago."""
    from warmgate.client.errors import WarmgateRpcError

    try:
        for _ in client.generate([], max_tokens=1, timeout=30):
            pass
    except WarmgateRpcError as exc:
        if exc.code.name != "INVALID_ARGUMENT":
            raise


def _wait_loaded(client: Any, server: ServerProcess, timeout: float) -> None:
    """Until GetStatus says the model is loaded and nothing runs on the runner."""
    from warmgate.client.errors import WarmgateRpcError
    from warmgate.v1 import warmup_pb2 as pb

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError("the server exited:\n" + server.log_tail())
        try:
            status = client.get_status(timeout=10)
        except WarmgateRpcError as exc:
            if exc.code.name != "UNAVAILABLE":
                raise
        else:
            if status.state == pb.WARMUP_STATE_FAILED:
                raise RuntimeError(f"the model failed to load: {status.failure_reason}")
            if status.state == pb.WARMUP_STATE_PENDING and not status.work_in_flight:
                return
        time.sleep(POLL_S)
    raise RuntimeError(f"the model did not load within {timeout:.0f} s")


def measure_first(name: str, args: argparse.Namespace, flags: Sequence[str], vocab: int,
                  warmup: bool) -> FirstResult:
    from warmgate.client.api import WaitResult, WarmgateClient
    from warmgate.client.errors import WarmgateRpcError

    rng = random.Random(f"{args.seed}/{name}")

    def prompt() -> list[int]:
        return [rng.randrange(vocab) for _ in range(args.prompt_len)]

    with server_process(flags, keep_caches=args.keep_caches) as server, \
            WarmgateClient(server.target, timeout=args.ready_timeout) as client:
        retries = 0
        if warmup:
            if client.wait_ready(args.ready_timeout) is not WaitResult.READY:
                status = client.get_status()
                raise RuntimeError(f"{name}: not ready: {status.failure_reason}\n"
                                   + server.log_tail())
            ready_s = time.perf_counter() - server.started
            _warm_client(client)
            time.sleep(args.gap_s)
            first, server_first = timed_stream(client, prompt(), args.max_tokens,
                                                args.request_timeout)
        else:
            _wait_loaded(client, server, args.ready_timeout)
            ready_s = time.perf_counter() - server.started
            _warm_client(client)
            first_prompt = prompt()
            time.sleep(args.gap_s)
            while True:
                try:
                    first, server_first = timed_stream(client, first_prompt, args.max_tokens,
                                                        args.request_timeout)
                    break
                except WarmgateRpcError as exc:
                    # UNAVAILABLE: the server does not take Generate yet; its TTFT starts at
                    # the attempt it takes.
                    if exc.code.name != "UNAVAILABLE" or \
                            time.perf_counter() - server.started > args.ready_timeout:
                        raise
                    retries += 1
                    time.sleep(POLL_S)
        repeats = []
        for _ in range(args.repeats):
            time.sleep(args.gap_s)
            repeats.append(timed_stream(client, prompt(), args.max_tokens,
                                         args.request_timeout))
        back_to_back = [timed_stream(client, prompt(), args.max_tokens, args.request_timeout)[0]
                        for _ in range(args.repeats)]
        status = client.get_status()
    return FirstResult(name, ready_s, first, server_first, [c for c, _ in repeats],
                       [sv for _, sv in repeats], back_to_back, retries, status.device,
                       status.attention_backend)


# -- throughput -----------------------------------------------------------------------------

def measure_throughput(args: argparse.Namespace, flags: Sequence[str], vocab: int,
                       max_model_len: int) -> Summary:
    from warmgate.client.api import WaitResult, WarmgateClient

    specs = build_workload(args.throughput_requests or 2 * args.streams, rate=math.inf,
                           prompt_len=parse_distribution(f"fixed:{args.prompt_len}"),
                           output_len=args.output_len, vocab=vocab, seed=args.seed,
                           repetitive=args.repetitive, max_model_len=max_model_len)
    with server_process(flags, keep_caches=args.keep_caches) as server:
        with WarmgateClient(server.target, timeout=args.ready_timeout) as client:
            if client.wait_ready(args.ready_timeout) is not WaitResult.READY:
                raise RuntimeError("throughput server not ready:\n" + server.log_tail())
        results = asyncio.run(run_load(server.target, specs, concurrency=args.streams,
                                       temperature=args.temperature,
                                       timeout=args.request_timeout))
    return summarize(results)
