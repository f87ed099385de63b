"""--mode ttft: time to first token of the first Generate after ready, over the steady-state
median, with the warmup plan run before ready and with it disabled; then output tokens/s at
many concurrent streams without and with speculative decoding.

Usage: python bench/warm.py first-request --mode ttft [--server-args "--model tiny ..."]
       [--prompt-len 128] [--max-tokens 16] [--repeats 20] [--num-speculative-steps 3]
       [--streams 64] [--keep-caches] [--json] [--out FILE]

Every server is a fresh `python -m warmgate.server.main` process, so nothing compiled in one
measurement survives into the next, as on a new pod; unless --keep-caches, each process also
gets its own empty directory for TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR and
FLASHINFER_WORKSPACE_BASE, so on-disk compile caches are cold too.

TTFT (client side: request sent -> first message with tokens): one request right after the
server turns ready, then --repeats more, one at a time, each with a fresh random prompt of
the same length; ratio = first / median of the rest. Every one of these requests (the first
included) follows --gap-s of idleness, as requests to a lightly loaded pod do: a step after
a pause runs slower than back to back (cold host caches and clocks; --mode probe),
so a first request after the readiness wait against a back-to-back median would charge that
to the first request. --repeats more back to back give the other median, printed beside.
  (a) warmup on: wait for health SERVING.
  (b) warmup off (`--no-warmup-on-start --serve-before-ready`): wait until GetStatus says the
      model is loaded (PENDING, no runner work in flight), retrying while Generate answers
      UNAVAILABLE; the first request then pays every first-use cost the plan would have.
Throughput: bench/serve.py load-gen's client at --streams concurrent streams (all arriving at once),
on one server with --num-speculative-steps 0 and one with K, both warmed up; ratio K / 0.
--num-speculative-steps overrides one given in --server-args; the servers' --max-num-seqs
(default 8) caps the batch whatever --streams says.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
from collections.abc import Sequence
from pathlib import Path

from first_request_generate import (
    NO_WARMUP_FLAGS,
    FirstResult,
    measure_first,
    measure_throughput,
)
from load_gen import non_negative_int, positive_int, typed

from warmgate.server.devtools.load_stats import Summary
from warmgate.server.devtools.workload import parse_distribution


def _parser(prog: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--server-args", default="", help="warmgate-server flags, one string")
    p.add_argument("--prompt-len", type=typed(positive_int), default=128)
    p.add_argument("--max-tokens", type=typed(positive_int), default=16,
                   help="tokens per TTFT request")
    p.add_argument("--repeats", type=typed(positive_int), default=20, help="steady-state requests")
    p.add_argument("--gap-s", type=float, default=0.25,
                   help="idle seconds before the first and each steady request (0: back to "
                        "back)")
    p.add_argument("--num-speculative-steps", type=typed(non_negative_int), default=3,
                   metavar="K",
                   help="K of the TTFT servers and of the second throughput server")
    p.add_argument("--streams", type=typed(positive_int), default=64,
                   help="concurrent throughput streams")
    p.add_argument("--throughput-requests", type=typed(positive_int), default=None,
                   help="requests per throughput run (default 2 x --streams)")
    p.add_argument("--output-len", type=typed(parse_distribution),
                   default=parse_distribution("fixed:64"),
                   help="throughput max_tokens distribution (default fixed:64)")
    p.add_argument("--repetitive", action="store_true",
                   help="throughput prompts repeat a short motif (drafts get accepted)")
    p.add_argument("--temperature", type=float, default=0.0, help="throughput sampling")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--trials", type=typed(positive_int), default=1,
                   help="fresh servers per TTFT case; the table adds the median ratio")
    p.add_argument("--off-trials", type=typed(positive_int), default=None,
                   help="fresh servers for the warmup-off case (default --trials): its "
                        "ratio is in the hundreds, a few servers show it")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep-caches", action="store_true",
                   help="leave the compile cache variables as they are")
    p.add_argument("--ready-timeout", type=float, default=900.0)
    p.add_argument("--request-timeout", type=float, default=900.0,
                   help="deadline of one request (a cold first request may JIT for minutes)")
    p.add_argument("--json", action="store_true", help="print one JSON object, no table")
    p.add_argument("--out", default=None, help="also write the JSON object to this file")
    return p


def _trial(i: int, trials: int) -> str:
    return f" #{i + 1}" if trials > 1 else ""


def _median_ratio(results: Sequence[FirstResult]) -> dict[str, float]:
    return {"client": round(statistics.median(r.ratio for r in results), 4),
            "server": round(statistics.median(r.server_ratio for r in results), 4),
            "client_back_to_back": round(
                statistics.median(r.back_to_back_ratio for r in results), 4)}


def _throughput_row(k: int, s: Summary) -> str:
    acc = s.draft_acceptance
    errors = sum(s.errors.values())
    return (f"{k:>3} {s.output_tokens_per_s:>9.1f} {s.requests_per_s:>7.2f} "
            f"{s.ttft_s.p50 * 1e3:>11.1f} {s.itl_s.p50 * 1e3:>10.2f} "
            f"{'-' if math.isnan(acc) else f'{acc:.1%}':>10} {s.num_preemptions:>11} "
            f"{errors:>6}")


def main(argv: list[str], prog: str | None = None) -> int:
    args = _parser(prog).parse_args(argv)
    from warmgate.server.startup import load_server_config  # no torch

    user_flags = shlex.split(args.server_args)
    k = args.num_speculative_steps
    k_flags = [*user_flags, "--num-speculative-steps", str(k)]
    # The same parse as the child's (its environment included), for the prompts' vocab.
    model = load_server_config(k_flags, environ=os.environ, resolve=False).runner.model
    if args.prompt_len + args.max_tokens > model.max_model_len:
        raise SystemExit(f"--prompt-len + --max-tokens exceed the model's max_model_len "
                         f"({model.max_model_len})")

    # A first request is one sample per server process: --trials fresh servers per case.
    ons = [measure_first(f"warmup on{_trial(i, args.trials)}", args,
                         [*k_flags, "--warmup-on-start"], model.vocab_size, warmup=True)
           for i in range(args.trials)]
    offs = [measure_first(f"warmup off{_trial(i, args.trials)}", args,
                          [*k_flags, *NO_WARMUP_FLAGS], model.vocab_size, warmup=False)
            for i in range(args.off_trials or args.trials)]
    on = ons[0]
    throughput: dict[int, Summary] = {}
    if not args.skip_throughput:
        for steps in dict.fromkeys((0, k)):  # one run when K is 0
            throughput[steps] = measure_throughput(
                args, [*user_flags, "--num-speculative-steps", str(steps), "--warmup-on-start"],
                model.vocab_size, model.max_model_len)
    tp_ratio = (throughput[k].output_tokens_per_s / throughput[0].output_tokens_per_s
                if k and len(throughput) == 2 else None)

    report = {
        "setup": {"model": model.name, "device": on.device, "attention_backend": on.backend,
                  "server_args": user_flags, "num_speculative_steps": k,
                  "prompt_len": args.prompt_len, "max_tokens": args.max_tokens,
                  "repeats": args.repeats, "streams": args.streams,
                  "output_len": str(args.output_len), "repetitive": args.repetitive,
                  "keep_caches": args.keep_caches, "seed": args.seed},
        "ttft": {"warmup_on": [r.to_dict() for r in ons],
                 "warmup_off": [r.to_dict() for r in offs],
                 "median_ratio": {"warmup_on": _median_ratio(ons),
                                  "warmup_off": _median_ratio(offs)}},
        "throughput": {f"k{steps}": s.to_dict() for steps, s in throughput.items()},
        "throughput_ratio": None if tp_ratio is None else round(tp_ratio, 4),
    }
    text = json.dumps(report)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.json:
        print(text)
        return 0

    print(f"first TTFT after ready / steady median: {model.name} on {on.device} "
          f"({on.backend}), k={k}, prompt {args.prompt_len}, max_tokens {args.max_tokens}, "
          f"{args.repeats} repeats, {args.gap_s:g} s idle before each, caches "
          f"{'kept' if args.keep_caches else 'fresh'}")
    print(f"{'':<14} {'':>8} {'client (send -> first message)':^30}   "
          f"{'server (arrival -> first token)':^30}   {'client, back to back':^18}")
    print(f"{'case':<14} {'ready_s':>8} {'first_ms':>10} {'median_ms':>10} {'ratio':>8}   "
          f"{'first_ms':>10} {'median_ms':>10} {'ratio':>8}   {'median_ms':>10} {'ratio':>7} "
          f"{'retries':>8}")
    for r in (*ons, *offs):
        b2b = statistics.median(r.back_to_back_s)
        print(f"{r.name:<14} {r.ready_s:>8.2f} {r.first_s * 1e3:>10.2f} "
              f"{r.median_s * 1e3:>10.2f} {r.ratio:>8.2f}   {r.server_first_s * 1e3:>10.2f} "
              f"{r.server_median_s * 1e3:>10.2f} {r.server_ratio:>8.2f}   {b2b * 1e3:>10.2f} "
              f"{r.back_to_back_ratio:>7.2f} {r.retries:>8}")
    if args.trials > 1:
        on_r, off_r = _median_ratio(ons), _median_ratio(offs)
        print(f"median of first / steady median: warmup on {on_r['client']:.2f} over "
              f"{len(ons)} servers (server side {on_r['server']:.2f}; over the back-to-back "
              f"median {on_r['client_back_to_back']:.2f}), warmup off {off_r['client']:.2f} "
              f"over {len(offs)}")
    if throughput:
        any_s = next(iter(throughput.values()))
        print(f"throughput at {args.streams} streams ({any_s.num_requests} requests, prompt "
              f"{args.prompt_len}, output {args.output_len}"
              f"{', repetitive' if args.repetitive else ''}, temperature "
              f"{args.temperature:g})")
        print(f"{'k':>3} {'out_tok/s':>9} {'req/s':>7} {'ttft_p50_ms':>11} {'itl_p50_ms':>10} "
              f"{'acceptance':>10} {'preemptions':>11} {'errors':>6}")
        for steps, s in throughput.items():
            print(_throughput_row(steps, s))
        if tp_ratio is not None:
            print(f"throughput ratio k={k} / k=0: {tp_ratio:.2f}x")
    return 0

