"""Serving on a CPU device with torch's default intra-op threads (one per core) against
warmgate's default (--cpu-threads 0: every usable core but one), side by side in one run.

    python bench/serve.py cpu-threads [--server-args "--model tiny"] [--requests 40] [--streams 8]

For each setting, one fresh server process (warmed up), then: --requests single requests one
after another, each after --gap-s idle (time to first token, server side, p50 / p90 / max);
then --streams concurrent streams (output tokens/s). Ratios are torch default / warmgate.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import shlex
import sys
import time

from first_request_generate import server_process, timed_stream
from load_gen import positive_int, run_load, typed

from warmgate.server.cpu_threads import usable_cpus
from warmgate.server.devtools.load_stats import Stats, summarize
from warmgate.server.devtools.workload import build_workload, parse_distribution


def sequential_ttft(target: str, n: int, prompt_len: int, vocab: int, gap_s: float) -> Stats:
    from warmgate.client.api import WarmgateClient

    rng = random.Random(0)
    ttfts = []
    with WarmgateClient(target, timeout=120) as client:
        for _ in range(n):
            time.sleep(gap_s)
            prompt = [rng.randrange(vocab) for _ in range(prompt_len)]
            _, server_ttft = timed_stream(client, prompt, 4, 120)
            ttfts.append(server_ttft)
    return Stats.of(ttfts)


def measure(flags: list[str], args: argparse.Namespace, vocab: int) -> tuple[Stats, float]:
    from warmgate.client.api import WaitResult, WarmgateClient

    with server_process([*flags, "--warmup-on-start"], keep_caches=True) as server:
        with WarmgateClient(server.target, timeout=300) as client:
            if client.wait_ready(300) is not WaitResult.READY:
                raise RuntimeError("server not ready:\n" + server.log_tail())
        ttft = sequential_ttft(server.target, args.requests, args.prompt_len, vocab,
                               args.gap_s)
        specs = build_workload(args.streams * 4, rate=math.inf,
                               prompt_len=parse_distribution(f"fixed:{args.prompt_len}"),
                               output_len=parse_distribution("fixed:32"), vocab=vocab,
                               seed=0)
        results = asyncio.run(run_load(server.target, specs, concurrency=args.streams,
                                       timeout=300))
    return ttft, summarize(results).output_tokens_per_s


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server-args", default="--model tiny")
    p.add_argument("--requests", type=typed(positive_int), default=40)
    p.add_argument("--streams", type=typed(positive_int), default=8)
    p.add_argument("--prompt-len", type=typed(positive_int), default=32)
    p.add_argument("--gap-s", type=float, default=0.05)
    args = p.parse_args(argv)
    from warmgate.server.startup import load_server_config

    user = [*shlex.split(args.server_args), "--device", "cpu"]
    vocab = load_server_config(user, environ={}, resolve=False).runner.model.vocab_size
    cores = usable_cpus()
    cases = {f"torch default ({cores} threads)": [*user, "--cpu-threads", str(cores)],
             f"warmgate auto ({max(1, cores - 1)})": [*user, "--cpu-threads", "0"]}
    rows = {name: measure(flags, args, vocab) for name, flags in cases.items()}
    print(f"CPU serving, {args.server_args}: {args.requests} single requests ({args.gap_s:g} s "
          f"apart, prompt {args.prompt_len}), then {args.streams} concurrent streams")
    print(f"{'threads':<28} {'ttft p50 ms':>11} {'p90 ms':>8} {'max ms':>8} {'out tok/s':>10}")
    for name, (ttft, tps) in rows.items():
        print(f"{name:<28} {ttft.p50 * 1e3:>11.2f} {ttft.p90 * 1e3:>8.2f} "
              f"{ttft.max * 1e3:>8.2f} {tps:>10.1f}")
    (d_ttft, d_tps), (w_ttft, w_tps) = rows.values()
    print(f"torch default / warmgate auto: ttft p50 {d_ttft.p50 / w_ttft.p50:.2f}x, p90 "
          f"{d_ttft.p90 / w_ttft.p90:.2f}x, max {d_ttft.max / w_ttft.max:.2f}x; throughput "
          f"{d_tps / w_tps:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
