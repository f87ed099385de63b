"""Steady-state serving: output tokens/s, inter-token latency and time to first token at a sweep
of concurrent streams, each against the HBM roofline of its batch.

    python bench/serve.py throughput --server-args "--model llama-3.1-8b --device cuda \\
        --attention-backend flashinfer --max-num-seqs 128" --streams 1,64,128 \\
        --prompt-len 512 --output-len 256 [--rounds 2] [--requests-per-stream 4] \\
        [--hbm-tbps 4.8] [--json FILE]

A real `warmgate-server` process starts from --server-args and warms up; this process is only
its client (grpc.aio, one channel; with --client-processes P, P processes each with its
own, the streams dealt among them). For each stream count, --rounds rounds of that many
requests arrive at once (random prompts of --prompt-len tokens, greedy, `ignore_eos`, exactly
--output-len tokens each). Per round: output tokens / the round's wall time, the median and
p99 gap between a stream's tokens (ITL), the median TTFT; the table shows the best round by
tokens/s. With --requests-per-stream R > 1 a round is a closed loop instead: R x streams
requests, at most `streams` in flight, each finished one letting the next go, and tokens/s and
ITL are read over the window in which every stream is busy (devtools.steady_window: after the
first wave's last first token, before the queue runs dry), the steady state of that many
concurrent users; `window s` gives its length. Roofline (warmgate.server.devtools.roofline):
a decode step must read every weight and each stream's KV cache (prompt + half the output on
average) at --hbm-tbps, so `roofline step` is the least ITL at that batch and `roofline tok/s`
the most tokens/s; `ITL / roofline` and `tok/s / roofline` say how close the engine comes.
Prompts take compute the decode roofline leaves out, so `ceiling` (devtools.served_ceiling) is
the most tokens/s of the whole workload at the card's peak FLOP/s and bandwidth, and `ratio`
the served figure over it.
Each round also prints the server's steps over it by kind (bench/lib/step_kinds.py): decode,
mixed (prompt chunks beside decodes, which set the ITL tail) and prefill, their mean time and
the prompt tokens each carried.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import signal
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from client_processes import run_load_processes
from first_request_options import METRICS_PORT, scrape_metrics
from step_kinds import between, describe, step_totals

from warmgate.server.config.startup_checks import SERVED_DTYPE_BYTES
from warmgate.server.devtools.gpu_card import PEAK_BF16_FLOPS, detect
from warmgate.server.devtools.load_stats import RequestResult, Stats, summarize
from warmgate.server.devtools.roofline import Roofline
from warmgate.server.devtools.served_ceiling import ServedCeiling
from warmgate.server.devtools.server_process import ServerProcess
from warmgate.server.devtools.steady_window import steady_window
from warmgate.server.devtools.workload import build_workload, parse_distribution

READY_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Row:
    streams: int
    output_tokens: int
    errors: int
    tokens_per_s: float
    itl_p50_s: float
    itl_p99_s: float
    ttft_p50_s: float
    roofline_step_s: float
    roofline_tokens_per_s: float
    window_s: float  # the seconds tokens/s and ITL were read over
    ceiling_tokens_per_s: float = math.nan  # devtools.served_ceiling; NaN without a peak

    @property
    def itl_over_roofline(self) -> float:
        return self.itl_p50_s / self.roofline_step_s

    @property
    def tokens_over_roofline(self) -> float:
        return self.tokens_per_s / self.roofline_tokens_per_s

    @property
    def tokens_over_ceiling(self) -> float:
        return self.tokens_per_s / self.ceiling_tokens_per_s


def row_of(streams: int, results: Sequence[RequestResult], roofline: Roofline,
           closed_loop: bool, ceiling: ServedCeiling | None = None) -> Row:
    """A burst's row over its whole wall time; a closed loop's over its steady window (NaN
    figures when the run had none)."""
    summary = summarize(results)
    tokens_per_s, itl, window_s = summary.output_tokens_per_s, summary.itl_s, summary.wall_s
    if closed_loop:
        window = steady_window(results, streams)
        tokens_per_s, itl, window_s = ((window.tokens_per_s, window.itl_s, window.seconds)
                                       if window is not None else (math.nan, Stats.of([]), 0.0))
    return Row(streams, summary.output_tokens, summary.num_requests - summary.num_ok,
               tokens_per_s, itl.p50, itl.p99, summary.ttft_s.p50, roofline.step_s,
               roofline.tokens_per_s, window_s,
               math.nan if ceiling is None else ceiling.tokens_per_s)


def format_rows(rows: list[Row]) -> list[str]:
    lines = [f"{'streams':>7} {'tok/s':>9} {'roofline':>9} {'ratio':>6} {'ITL p50':>9} "
             f"{'ITL p99':>9} {'roofline':>9} {'ITL/roof':>8} {'TTFT p50':>9} {'tokens':>7} "
             f"{'errors':>6} {'window':>7} {'ceiling':>9} {'ratio':>6}",
             f"{'':>7} {'':>9} {'tok/s':>9} {'':>6} {'ms':>9} {'ms':>9} {'step ms':>9} "
             f"{'':>8} {'ms':>9} {'':>7} {'':>6} {'s':>7} {'tok/s':>9} {'':>6}"]
    for r in rows:
        lines.append(f"{r.streams:7d} {r.tokens_per_s:9.0f} {r.roofline_tokens_per_s:9.0f} "
                     f"{r.tokens_over_roofline:6.2f} {r.itl_p50_s * 1e3:9.2f} "
                     f"{r.itl_p99_s * 1e3:9.2f} {r.roofline_step_s * 1e3:9.2f} "
                     f"{r.itl_over_roofline:8.2f} {r.ttft_p50_s * 1e3:9.2f} "
                     f"{r.output_tokens:7d} {r.errors:6d} {r.window_s:7.2f} "
                     f"{r.ceiling_tokens_per_s:9.0f} {r.tokens_over_ceiling:6.2f}")
    return lines


def _parser(prog: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server-args", default="--model tiny",
                   help="warmgate-server flags, one string (the model and its shapes)")
    p.add_argument("--streams", default="1,64,128", help="comma-separated stream counts")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--rounds", type=int, default=1, help="rounds per stream count")
    p.add_argument("--requests-per-stream", type=int, default=1,
                   help="1: a round is one burst of `streams` requests; R > 1: a closed loop "
                        "of R x streams requests read over its steady window")
    p.add_argument("--hbm-tbps", type=float, default=None,
                   help="device memory bandwidth for the roofline, TB/s (default: the "
                        "detected card's, devtools.gpu_card)")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="dense bfloat16 peak for the served ceiling, TFLOP/s (default: the "
                        "detected card's, devtools.served_ceiling; none on a CPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--client-processes", type=int, default=1,
                   help="client processes the streams are dealt over, at most one a stream "
                        "(one Python client reads about 20,000 messages a second on a small "
                        "CPU: bench/lib/client_processes.py)")
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--json", default=None, help="also write the rows to this file")
    return p


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    from warmgate.client.api import WaitResult, WarmgateClient
    from warmgate.server.startup import load_server_config

    args = _parser(prog).parse_args(argv)
    streams = [int(s) for s in args.streams.split(",")]
    if (min(streams) < 1 or args.prompt_len < 1 or args.output_len < 2 or args.rounds < 1
            or args.requests_per_stream < 1 or args.client_processes < 1):
        raise SystemExit("--streams >= 1, --prompt-len >= 1, --output-len >= 2, --rounds >= 1, "
                         "--requests-per-stream >= 1, --client-processes >= 1")
    closed_loop = args.requests_per_stream > 1
    flags = [*shlex.split(args.server_args), "--metrics-port", "0"]
    config = load_server_config(flags, environ={})  # the model's shapes, for the roofline
    model = config.runner.model
    dtype_bytes = SERVED_DTYPE_BYTES[config.runner.device.dtype]
    mean_context = args.prompt_len + args.output_len / 2
    if args.hbm_tbps is None:  # measured before the server holds the memory
        card = detect(config.runner.device.device)
        print(card.describe(), flush=True)
        args.hbm_tbps = card.bytes_per_s / 1e12
        if args.peak_tflops is None and card.slug in PEAK_BF16_FLOPS:
            args.peak_tflops = PEAK_BF16_FLOPS[card.slug] / 1e12
    rows: list[Row] = []
    with ServerProcess(flags, device=None, start_timeout_s=READY_TIMEOUT_S,
                       stop_signal=signal.SIGTERM) as server, \
            WarmgateClient(server.target, timeout=READY_TIMEOUT_S) as client:
        if client.wait_ready(READY_TIMEOUT_S) is not WaitResult.READY:
            raise SystemExit("not ready: " + client.get_status().failure_reason + "\n"
                             + server.log_tail())
        metrics_port = int(server.wait_for(METRICS_PORT).group(1))
        for n in streams:
            roofline = Roofline.of(model, n, mean_context, bytes_per_s=args.hbm_tbps * 1e12,
                                   dtype_bytes=dtype_bytes)
            ceiling = (ServedCeiling.of(model, n, args.prompt_len, args.output_len,
                                        bytes_per_s=args.hbm_tbps * 1e12,
                                        flops_per_s=args.peak_tflops * 1e12,
                                        dtype_bytes=dtype_bytes)
                       if args.peak_tflops is not None and model.fp8 is None else None)
            rounds = []
            for r in range(args.rounds):
                specs = build_workload(
                    n * args.requests_per_stream, rate=float("inf"),
                    prompt_len=parse_distribution(f"fixed:{args.prompt_len}"),
                    output_len=parse_distribution(f"fixed:{args.output_len}"),
                    vocab=model.vocab_size, seed=args.seed * 1000 + r)
                before = step_totals(scrape_metrics(metrics_port))
                results = run_load_processes(
                    server.target, specs, processes=min(args.client_processes, n), concurrency=n,
                    timeout=args.request_timeout, ignore_eos=True)
                rounds.append(row_of(n, results, roofline, closed_loop, ceiling))
                after = step_totals(scrape_metrics(metrics_port))
                print(f"{n} streams, round {r + 1}: {describe(between(before, after))}",
                      flush=True)
            best = max(rounds, key=lambda row: (not math.isnan(row.tokens_per_s),
                                                row.tokens_per_s))
            print(f"{n} streams: {statistics.median(r.tokens_per_s for r in rounds):.0f} "
                  f"tok/s median of {len(rounds)} rounds, best {best.tokens_per_s:.0f}",
                  flush=True)
            rows.append(best)
    print(f"model {model.name}, {model.num_layers} layers; prompt {args.prompt_len}, output "
          f"{args.output_len}, greedy, ignore_eos; "
          + (f"closed loop of {args.requests_per_stream} requests a stream, read over its "
             f"steady window; " if closed_loop else "one burst a round; ")
          + f"roofline at {args.hbm_tbps:g} TB/s, "
          f"{dtype_bytes}-byte weights and KV; ceiling: "
          + ("none (no peak FLOP/s for this card)" if args.peak_tflops is None else
             f"the decodes and their share of prompts, projections and attention each at the "
             f"longer of {args.peak_tflops:g} TFLOP/s and the bandwidth"))
    print("\n".join(format_rows(rows)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{**asdict(r), "itl_over_roofline": r.itl_over_roofline,
                        "tokens_over_roofline": r.tokens_over_roofline,
                        "tokens_over_ceiling": r.tokens_over_ceiling} for r in rows], f,
                      indent=1)
    return 1 if any(r.errors for r in rows) else 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
