"""Time to first token of the first Generate after ready, over the steady-state median, with
the warmup plan run before ready and with it disabled; then output tokens/s at many concurrent
streams without and with speculative decoding.

Usage: python bench/ttft_first.py [--server-args "--model tiny ..."] [--prompt-len 128]
       [--max-tokens 16] [--repeats 20] [--num-speculative-steps 3] [--streams 64]
       [--keep-caches] [--json] [--out FILE]

Every server is a fresh `python -m warmgate.server.main` process, so nothing compiled in one
measurement survives into the next, as on a new pod; unless --keep-caches, each process also
gets its own empty directory for TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR and
FLASHINFER_WORKSPACE_BASE, so on-disk compile caches are cold too.

TTFT (client side: request sent -> first message with tokens): one request right after the
server turns ready, then --repeats more, one at a time, each with a fresh random prompt of
the same length; ratio = first / median of the rest. Every one of these requests (the first
included) follows --gap-s of idleness, as requests to a lightly loaded pod do: a step after
a pause runs slower than back to back (cold host caches and clocks; bench/first_probe.py),
so a first request after the readiness wait against a back-to-back median would charge that
to the first request. --repeats more back to back give the other median, printed beside.
  (a) warmup on: wait for health SERVING.
  (b) warmup off (`--no-warmup-on-start --serve-before-ready`): wait until GetStatus says the
      model is loaded (PENDING, no runner work in flight), retrying while Generate answers
      UNAVAILABLE; the first request then pays every first-use cost the plan would have.
Throughput: bench/load_gen.py's client at --streams concurrent streams (all arriving at once),
on one server with --num-speculative-steps 0 and one with K, both warmed up; ratio K / 0.
--num-speculative-steps overrides one given in --server-args; the servers' --max-num-seqs
(default 8) caps the batch whatever --streams says.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/ttft_first.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.load_gen import non_negative_int, positive_int, run_load, typed
from bench.workload import Summary, build_workload, parse_distribution, summarize

ROOT = Path(__file__).resolve().parents[1]
CACHE_ENV_VARS = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE")
MAIN_PORT = re.compile(r"serving warmgate\.v1\.Warmup on 127\.0\.0\.1:(\d+)")
START_TIMEOUT_S = 300.0  # process start to port bound (imports, argument checks)
POLL_S = 0.05  # GetStatus / UNAVAILABLE retry interval while waiting for the model
NO_WARMUP_FLAGS = ("--no-warmup-on-start", "--serve-before-ready")


# -- a server process -----------------------------------------------------------------------

class ServerProcess:
    """`python -m warmgate.server.main` on loopback with a free port read from its log."""

    def __init__(self, flags: Sequence[str], *, keep_caches: bool) -> None:
        env = dict(os.environ)
        # The source tree first, so the bench measures this checkout even when another
        # warmgate is installed.
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT / "client"), str(ROOT / "server"), *filter(None, [env.get("PYTHONPATH")])])
        self._cache_root: str | None = None
        if not keep_caches:
            self._cache_root = tempfile.mkdtemp(prefix="warmgate-ttft-first-")
            for var in CACHE_ENV_VARS:
                env[var] = os.path.join(self._cache_root, var.lower())
        self.argv = [sys.executable, "-m", "warmgate.server.main", "--host", "127.0.0.1",
                     "--port", "0", "--metrics-port", "-1", *flags]
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(self.argv, env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        # The last lines of the log, for the error message if the server dies.
        self._tail: deque[str] = deque(maxlen=40)
        self._port: int | None = None
        self._bound = threading.Event()
        # Read the log on a thread, so a chatty server never blocks on a full pipe.
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._bound.wait(START_TIMEOUT_S) or self._port is None:
            self.close()
            raise RuntimeError("the server did not bind its port:\n" + self.log_tail())
        self.target = f"127.0.0.1:{self._port}"

    def _read(self) -> None:
        assert self.proc.stderr is not None  # stderr=PIPE
        for line in self.proc.stderr:
            self._tail.append(line)
            if self._port is None and (match := MAIN_PORT.search(line)) is not None:
                self._port = int(match.group(1))
                self._bound.set()
        self._bound.set()  # the process ended: wake the waiter, which sees no port

    def log_tail(self) -> str:
        return "".join(self._tail)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: the server's graceful stop
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._reader.join(5)
        if self._cache_root is not None:
            shutil.rmtree(self._cache_root, ignore_errors=True)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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


def timed_stream(client: Any, prompt: list[int], max_tokens: int,
                  timeout: float) -> tuple[float, float]:
    """(client TTFT, server TTFT) of one request, read to its end so the next runs alone."""
    start = time.perf_counter()
    first: float | None = None
    server_ttft = math.nan
    for message in client.generate(prompt, max_tokens=max_tokens, timeout=timeout):
        if first is None and message.token_ids:
            first = time.perf_counter() - start
        if message.HasField("usage"):
            server_ttft = message.usage.time_to_first_token_s
    if first is None:
        raise RuntimeError("the stream ended without a token")
    return first, server_ttft


def _warm_client(client: Any) -> None:
    """One Generate with an empty prompt: the server refuses it (INVALID_ARGUMENT) before it
    reaches the scheduler or the runner, but the client's first call on the method (stub and
    call set-up, about 10 ms in Python) is paid here, not by the timed first request, as a
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

    with ServerProcess(flags, keep_caches=args.keep_caches) as server, \
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
    with ServerProcess(flags, keep_caches=args.keep_caches) as server:
        with WarmgateClient(server.target, timeout=args.ready_timeout) as client:
            if client.wait_ready(args.ready_timeout) is not WaitResult.READY:
                raise RuntimeError("throughput server not ready:\n" + server.log_tail())
        results = asyncio.run(run_load(server.target, specs, concurrency=args.streams,
                                       temperature=args.temperature,
                                       timeout=args.request_timeout))
    return summarize(results)


# -- the command ----------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
