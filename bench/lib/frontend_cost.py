"""What a streamed token costs the processes around the engine: the server's front (the gRPC
process, which turns the engine's step events into GenerateResponse messages), its engine
process and this client, in CPU time per message, against the tokens a second served.

    python bench/serve.py frontend-cost [--server-args "--model tiny --device cpu"] \
        [--streams 32,128] [--prompt-len 32] [--output-len 300]

A real `warmgate-server` starts from --server-args (its engine process as configured) and
warms up; for each stream count one burst of that many requests (random prompts, greedy,
`ignore_eos`) runs to the end. Each process's CPU seconds over the burst come from
/proc/PID/stat (Linux): the front's, and its child processes' summed as `engine` (the engine
process; any other child, a grammar compile helper, idles), this client's from
time.process_time. `us/msg` is CPU time per
message with tokens; `busy` is CPU seconds per wall second, a core's share: a process near
1.0 is what the burst waits on. A message carries every token its stream's queue held when
the front got to it (api/stream_events.py's coalesce), so `tok/msg` above 1 says the front fell
behind the steps (or, with --stream-interval N, about N).

With --arms "FLAGS;FLAGS" each arm's flags join --server-args on a server of its own, the
arms taking turns for --rounds rounds; last, per arm, the median over rounds of the front's
CPU microseconds per token and of the tokens a second, each also as a ratio to the first
arm's (for one stream count: the first of --streams):

    python bench/serve.py frontend-cost --streams 128 --rounds 3 \
        --server-args "--model tiny --device cpu" --arms "--stream-interval 1;--stream-interval 4"
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from load_gen import READY_TIMEOUT_S, run_load

from warmgate.server.devtools.load_stats import RequestResult
from warmgate.server.devtools.server_process import ServerProcess
from warmgate.server.devtools.workload import build_workload, parse_distribution

PROC = Path("/proc")


def process_cpu_s(pid: int, proc: Path = PROC) -> float:
    """User plus system CPU seconds of process `pid` so far (its threads included)."""
    stat = (proc / str(pid) / "stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()  # the name in parentheses may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child_pids(pid: int, proc: Path = PROC) -> list[int]:
    """The direct children of `pid` (the server's engine process among them)."""
    children: list[int] = []
    for task in sorted((proc / str(pid) / "task").iterdir()):
        try:
            children += [int(c) for c in (task / "children").read_text().split()]
        except OSError:  # a thread that ended meanwhile
            continue
    return children


@dataclass(frozen=True)
class CostRow:
    streams: int
    tokens: int
    messages: int
    wall_s: float
    front_cpu_s: float
    engine_cpu_s: float
    client_cpu_s: float

    @classmethod
    def of(cls, streams: int, results: list[RequestResult], wall_s: float, front_cpu_s: float,
           engine_cpu_s: float, client_cpu_s: float) -> CostRow:
        messages = [n for r in results for _, n in r.messages]
        return cls(streams, sum(messages), len(messages), wall_s, front_cpu_s, engine_cpu_s,
                   client_cpu_s)

    def cells(self) -> list[str]:
        per_msg = 1e6 / max(self.messages, 1)
        return [f"{self.streams:>7}", f"{self.tokens:>7}", f"{self.messages:>7}",
                f"{self.tokens / max(self.messages, 1):>7.2f}",
                f"{self.tokens / self.wall_s:>8.0f}",
                f"{self.front_cpu_s * per_msg:>9.1f}", f"{self.front_cpu_s / self.wall_s:>6.2f}",
                f"{self.engine_cpu_s / self.wall_s:>7.2f}",
                f"{self.client_cpu_s * per_msg:>10.1f}", f"{self.client_cpu_s / self.wall_s:>7.2f}"]


HEADER = ["streams", " tokens", "   msgs", "tok/msg", "   tok/s", "front us", "front",
          " engine", " client us", " client"]
HEADER2 = ["", "", "", "", "", "  per msg", "  busy", "   busy", "   per msg", "   busy"]


def format_rows(rows: list[CostRow]) -> list[str]:
    widths = [max(len(h), len(c)) for h, c in zip(HEADER, rows[0].cells(), strict=True)] \
        if rows else [len(h) for h in HEADER]
    line = [" ".join(h.rjust(w) for h, w in zip(HEADER, widths, strict=True)),
            " ".join(h.rjust(w) for h, w in zip(HEADER2, widths, strict=True))]
    return line + [" ".join(c.rjust(w) for c, w in zip(r.cells(), widths, strict=True))
                   for r in rows]


def _parser(prog: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server-args", default="--model tiny --device cpu",
                   help="warmgate-server flags, one string (--max-num-seqs defaults to the "
                        "largest stream count)")
    p.add_argument("--streams", default="32,128", help="comma-separated stream counts")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arms", default="", help="';'-separated server flags, one arm each")
    p.add_argument("--rounds", type=int, default=1, help="rounds of the arms, alternated")
    return p


def measure(target: str, front_pid: int, streams: int, args: argparse.Namespace,
            vocab: int) -> CostRow:
    specs = build_workload(streams, rate=float("inf"),
                           prompt_len=parse_distribution(f"fixed:{args.prompt_len}"),
                           output_len=parse_distribution(f"fixed:{args.output_len}"),
                           vocab=vocab, seed=args.seed)
    engine = child_pids(front_pid)
    front0, engine0 = process_cpu_s(front_pid), sum(process_cpu_s(p) for p in engine)
    client0, start = time.process_time(), time.perf_counter()
    results = asyncio.run(run_load(target, specs, concurrency=streams, ignore_eos=True))
    wall = time.perf_counter() - start
    errors = {r.error for r in results if r.error}
    if errors:
        raise SystemExit(f"{streams} streams: requests failed: {sorted(errors)}")
    return CostRow.of(streams, results, wall, process_cpu_s(front_pid) - front0,
                      sum(process_cpu_s(p) for p in engine) - engine0,
                      time.process_time() - client0)


def serve_and_measure(flags: list[str], streams: list[int], args: argparse.Namespace
                      ) -> list[CostRow]:
    """One fresh server on `flags`, warmed up, then one burst per stream count."""
    from warmgate.client.api import WaitResult, WarmgateClient
    from warmgate.server.startup import load_server_config

    vocab = load_server_config(flags, environ={}).runner.model.vocab_size
    rows = []
    with ServerProcess(flags, device=None, start_timeout_s=READY_TIMEOUT_S) as server, \
            WarmgateClient(server.target, timeout=READY_TIMEOUT_S) as client:
        if client.wait_ready(READY_TIMEOUT_S) is not WaitResult.READY:
            raise SystemExit("not ready: " + client.get_status().failure_reason)
        for n in streams:
            rows.append(measure(server.target, server.proc.pid, n, args, vocab))
            print(f"{n} streams: done", flush=True)
    print(f"server: {shlex.join(flags)}; prompt {args.prompt_len}, output {args.output_len}, "
          f"one burst a stream count; {os.cpu_count()} CPUs")
    for line in format_rows(rows):
        print(line)
    return rows


def arms_summary(arms: list[str], rows: list[list[CostRow]]) -> list[str]:
    """Per arm (rows[i]: its first stream count's row in each round), the medians of the
    front's CPU us per token and of tok/s, and their ratios to the first arm's."""
    medians = [(statistics.median(r.front_cpu_s * 1e6 / r.tokens for r in arm),
                statistics.median(r.tokens / r.wall_s for r in arm)) for arm in rows]
    base_us, base_tps = medians[0]
    return [f"arm {arm or '(none)'}: front {us:.1f} us/token ({us / base_us:.2f}x), "
            f"{tps:.0f} tok/s ({tps / base_tps:.2f}x), median of {len(r)} rounds"
            for arm, (us, tps), r in zip(arms, medians, rows, strict=True)]


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    args = _parser(prog).parse_args(argv)
    streams = [int(s) for s in args.streams.split(",")]
    if min(streams) < 1 or args.prompt_len < 1 or args.output_len < 1 or args.rounds < 1:
        raise SystemExit("--streams >= 1, --prompt-len >= 1, --output-len >= 1, --rounds >= 1")
    flags = [*shlex.split(args.server_args), "--metrics-port", "0"]  # a free port
    if "--max-num-seqs" not in flags:
        flags += ["--max-num-seqs", str(max(streams))]
    arms = [a.strip() for a in args.arms.split(";")] if args.arms else [""]
    rows: list[list[CostRow]] = [[] for _ in arms]
    for round_ in range(1, args.rounds + 1):
        for i, arm in enumerate(arms):
            if len(arms) > 1 or args.rounds > 1:
                print(f"=== round {round_}: arm {arm or '(none)'}", flush=True)
            rows[i].append(serve_and_measure([*flags, *shlex.split(arm)], streams, args)[0])
    if len(arms) > 1:
        for line in arms_summary(arms, rows):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
