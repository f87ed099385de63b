"""Random Generate requests against a real `warmgate-server` after ready: does anything compile,
autotune or miss a CUDA graph on a request's path, and is the first request as fast as the
steady ones?

    python bench/warm.py served --requests 600 --server-args "--model qwen3-30b-a3b \\
        --device cuda --attention-backend triton --num-speculative-steps 3"

One fresh server (its own process, the engine process as configured; the machine's compile
caches, as on a node whose pods share a cache volume) turns ready. Then, in order:
  ttft      after --gap-s of idleness one --prompt-len request (greedy, --ttft-tokens tokens),
            then --repeats more, each after the same gap: first / steady median TTFT, every
            sample at the client and at the server, and the server's queue inside it
  workload  --requests random requests in waves of 1..--max-concurrency at once. Each draws a
            prompt of 1..--max-prompt tokens, 1..--max-tokens new tokens and its sampling at
            random (greedy, temperature, top-k, top-p, seeded; and each option - logprobs,
            prompt logprobs, the three penalties, min_p, min_tokens with stop ids,
            logit_bias - on about one request in four: the same draw as `coverage`)
  metrics   the server's /metrics: JIT compiles after ready by kind (autotune is the fused
            MoE kernel timing launches for a token-count bucket) and CUDA-graph misses after
            ready
Prints one line per part, the options the workload used, and last `after_ready: compiles N
(by kind) graph_misses M`. Exit 1 when a compile, an autotune or a graph miss came after
ready, or a request failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import re
import shlex
import signal
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from first_request_generate import _warm_client, server_process, timed_stream_parts
from first_request_options import AFTER_READY, METRICS_PORT, scrape_metrics
from gpu_clock import sm_clock_reader

from warmgate.server.devtools.random_batches import random_features, random_params
from warmgate.server.devtools.server_process import ServerProcess
from warmgate.server.runner.scheduler_output import SamplingParams

AFTER_READY_COMPILES = re.compile(
    r'^warmgate_jit_compiles_total\{(?=[^}]*after_ready="true")[^}]*kind="(\w+)"[^}]*\} (\S+)',
    re.M)


@dataclass(frozen=True)
class AfterReady:
    compiles: dict[str, int]  # by kind, only the kinds that compiled
    graph_misses: int

    @property
    def total(self) -> int:
        return sum(self.compiles.values()) + self.graph_misses


def after_ready(metrics_text: str) -> AfterReady:
    """What the server counted after ready, from a /metrics scrape (every rank summed)."""
    compiles: Counter[str] = Counter()
    for kind, value in AFTER_READY_COMPILES.findall(metrics_text):
        compiles[kind] += int(float(value))
    misses = sum(int(float(v)) for v in AFTER_READY["graph_misses"].findall(metrics_text))
    return AfterReady({k: n for k, n in sorted(compiles.items()) if n}, misses)


def request_kwargs(params: SamplingParams, max_tokens: int) -> dict[str, Any]:
    """The Generate options (client keyword arguments) that ask for `params`."""
    kw: dict[str, Any] = {"temperature": params.temperature, "top_k": params.top_k,
                          "max_tokens": max_tokens,
                          "presence_penalty": params.presence_penalty,
                          "frequency_penalty": params.frequency_penalty,
                          # Within max_tokens: the prompt was sized to leave that much room.
                          "min_p": params.min_p, "min_tokens": min(params.min_tokens,
                                                                   max_tokens),
                          "stop_token_ids": list(params.stop_token_ids),
                          "logit_bias": dict(params.logit_bias)}
    if params.top_p < 1.0:
        kw["top_p"] = params.top_p
    if params.seed is not None:
        kw["seed"] = params.seed
    if params.logprobs is not None:
        kw["logprobs"] = params.logprobs
    if params.prompt_logprobs is not None:
        kw["prompt_logprobs"] = params.prompt_logprobs
    if params.repetition_penalty != 1.0:
        kw["repetition_penalty"] = params.repetition_penalty
    return kw


def options_used(kw: dict[str, Any]) -> list[str]:
    """The sampling kind and every option a request's keyword arguments turn on."""
    kind = "greedy" if kw["temperature"] == 0 else "seeded" if "seed" in kw else "random"
    on = [name for name in ("logprobs", "prompt_logprobs", "repetition_penalty", "top_p")
          if name in kw]
    on += [name for name in ("presence_penalty", "frequency_penalty", "min_p", "min_tokens",
                             "logit_bias", "top_k") if kw[name]]
    return [kind, *on]


def draw_requests(rng: random.Random, n: int, vocab: int, max_prompt: int, max_tokens: int
                  ) -> list[tuple[list[int], dict[str, Any]]]:
    out = []
    for _ in range(n):
        params = random_features(rng, random_params(rng), vocab)
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, max_prompt))]
        out.append((prompt, request_kwargs(params, rng.randint(1, max_tokens))))
    return out


async def run_waves(target: str, requests: list[tuple[list[int], dict[str, Any]]],
                    max_concurrency: int, rng: random.Random, timeout: float
                    ) -> tuple[int, Counter[str], int]:
    """Every request, in waves of random size sent at once; (tokens, errors by status code,
    waves)."""
    from warmgate.client.aio import AsyncWarmgateClient
    from warmgate.client.errors import WarmgateRpcError

    errors: Counter[str] = Counter()
    tokens = waves = 0

    async def one(c: AsyncWarmgateClient, prompt: list[int], kw: dict[str, Any]) -> int:
        try:
            return sum([len(m.token_ids) async for m in c.generate(prompt, timeout=timeout,
                                                                   **kw)])
        except WarmgateRpcError as exc:
            errors[exc.code.name] += 1
            return 0

    async with AsyncWarmgateClient(target) as c:
        i = 0
        while i < len(requests):
            size = rng.randint(1, max_concurrency)
            wave = requests[i:i + size]
            i += len(wave)
            waves += 1
            tokens += sum(await asyncio.gather(*(one(c, p, kw) for p, kw in wave)))
    return tokens, errors, waves


def _parser(prog: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server-args", default="--model tiny",
                   help="warmgate-server flags, one string (the device is theirs: auto)")
    p.add_argument("--requests", type=int, default=600)
    p.add_argument("--max-concurrency", type=int, default=64)
    p.add_argument("--max-prompt", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=128, help="the TTFT requests' prompt")
    p.add_argument("--ttft-tokens", type=int, default=8)
    p.add_argument("--repeats", type=int, default=10, help="steady TTFT requests")
    p.add_argument("--gap-s", type=float, default=0.5, help="idle seconds before each TTFT one")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ttft-gate", default=None, metavar="PREFIX",
                   help="once ready, create PREFIX.ready and wait for PREFIX.go before timing "
                        "TTFT, then create PREFIX.measured: a coordinator of servers run side "
                        "by side (bench/warm.py smoke) lets each time its TTFT while no other "
                        "warms up or times its own")
    p.add_argument("--server-log", default=None, metavar="PATH",
                   help="write the server's whole log here when the run ends, failed or not "
                        "(a SIGTERM ends the run that way too): where its ready seconds went")
    p.add_argument("--ready-timeout", type=float, default=900.0)
    p.add_argument("--request-timeout", type=float, default=300.0)
    return p


@contextlib.contextmanager
def _gated(prefix: str | None, timeout_s: float) -> Any:
    """Between PREFIX.ready and PREFIX.measured, after PREFIX.go (see --ttft-gate)."""
    if prefix is None:
        yield
        return
    Path(prefix + ".ready").touch()
    deadline = time.monotonic() + timeout_s
    while not Path(prefix + ".go").exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"{prefix}.go did not come within {timeout_s:.0f} s")
        time.sleep(0.1)
    try:
        yield
    finally:
        Path(prefix + ".measured").touch()


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    from warmgate.server.startup import load_server_config

    args = _parser(prog).parse_args(argv)
    flags = [*shlex.split(args.server_args), "--metrics-port", "0"]
    runner = load_server_config(flags, environ={}, resolve=False).runner
    # Room for the prompt, its tokens and drafts within the model length.
    max_prompt = max(1, min(args.max_prompt, runner.model.max_model_len - args.max_tokens - 8))
    rng = random.Random(args.seed)
    print(f"server: {shlex.join(flags)}", flush=True)
    server = server_process(flags, keep_caches=True)
    # SIGTERM (the smoke's timeout) unwinds as an exit does, so the log below is written.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return _serve(args, server, runner.model.vocab_size, max_prompt, rng)
    finally:
        if args.server_log:
            Path(args.server_log).write_text(server.log())


def _serve(args: argparse.Namespace, server: ServerProcess, vocab: int, max_prompt: int,
           rng: random.Random) -> int:
    """Start the server, wait for ready, time TTFT, run the workload, read the metrics."""
    from warmgate.client.api import WaitResult, WarmgateClient

    with server, WarmgateClient(server.target, timeout=args.ready_timeout) as client:
        metrics_port = int(server.wait_for(METRICS_PORT).group(1))
        if client.wait_ready(args.ready_timeout) is not WaitResult.READY:
            raise SystemExit(f"not ready: {client.get_status().failure_reason}\n"
                             f"{server.log_tail()}")
        print(f"ready in {time.perf_counter() - server.started:.1f} s", flush=True)
        _warm_client(client)

        def ttft_prompt() -> list[int]:
            return [rng.randrange(vocab) for _ in range(min(args.prompt_len, max_prompt))]

        timed = []  # TtftParts per request, the first one first
        sm_clock = sm_clock_reader()
        # The SM clock (MHz) before each request's idle gap: a query tool run just before the
        # request would time its own start-up into the request's TTFT.
        clocks = []
        with _gated(args.ttft_gate, args.ready_timeout):
            for _ in range(args.repeats + 1):
                clocks.append(sm_clock())
                time.sleep(args.gap_s)
                timed.append(timed_stream_parts(client, ttft_prompt(), args.ttft_tokens,
                                                args.request_timeout, ignore_eos=True))
        ttfts = [t.client for t in timed]
        steady = statistics.median(ttfts[1:])
        print(f"ttft: first {ttfts[0] * 1e3:.2f} ms, steady median {steady * 1e3:.2f} ms over "
              f"{args.repeats}, first/steady {ttfts[0] / steady:.2f}", flush=True)
        # Every sample, and the server's own arrival -> first token: a first request slower
        # at the client only is the transport's; one slower at the server too is the engine's.
        print("ttft samples ms: " + "; ".join(
            f"{side} {' '.join(f'{t[i] * 1e3:.2f}' for t in timed)}"
            for i, side in ((0, "client"), (1, "server"))), flush=True)
        # The server's part split at its first scheduled step: a first request slow before it
        # is the front's or the engine's hand-off, one slow after it the step's (the device).
        print("ttft server queue ms: " + " ".join(f"{t.queue * 1e3:.2f}" for t in timed),
              flush=True)
        if any(c is not None for c in clocks):  # whether a slow first one ran at low clocks
            print("ttft sm clock MHz: " + " ".join(str(c) for c in clocks), flush=True)
        requests = draw_requests(rng, args.requests, vocab, max_prompt, args.max_tokens)
        start = time.perf_counter()
        tokens, errors, waves = asyncio.run(run_waves(
            server.target, requests, args.max_concurrency, rng, args.request_timeout))
        wall = time.perf_counter() - start
        print(f"workload: {len(requests)} requests in {waves} waves of 1..{args.max_concurrency},"
              f" prompts 1..{max_prompt}, {tokens} tokens in {wall:.1f} s, errors "
              f"{dict(errors) or 0}", flush=True)
        used = Counter(o for _, kw in requests for o in options_used(kw))
        print("options: " + ", ".join(f"{k} {n}" for k, n in sorted(used.items())))
        counted = after_ready(scrape_metrics(metrics_port))
    print(f"after_ready: compiles {sum(counted.compiles.values())} "
          f"({', '.join(f'{k} {n}' for k, n in counted.compiles.items()) or 'none'}) "
          f"graph_misses {counted.graph_misses}")
    return 1 if counted.total or errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
