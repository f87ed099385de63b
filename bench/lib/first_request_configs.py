"""--mode configs: the first Generate after ready against steady ones, on server configurations
nobody tuned the warmup for.

    python bench/warm.py first-request --mode configs --model llama-3.2-1b --device cuda \\
        --backends flashinfer,triton --configs 12 [--seed 0] \\
        [--config "K SEQS BUDGET LEN BLOCK PROMPT"]

Each configuration is drawn at random: k in 0..4, --max-num-seqs 1..128,
--max-num-batched-tokens 256..8192, --max-model-len 512..16384, --block-size 16 or 32, and a
prompt length that fits the model length. (`--config` gives one instead, repeated `--configs`
times per backend: a fixed configuration on fresh servers.) For each, a fresh
`warmgate-server` starts and turns ready; after `--gap-s` of idleness one request of that
prompt length runs (greedy, `ignore_eos`, `--max-tokens` tokens), then `--repeats` more, each
after the same gap. Per configuration the table shows the first request's time to first token
and its mean decode step (the time between its tokens) against the steady medians, and the
server's compiles and CUDA-graph misses after ready. Worst first/steady TTFT first; then per
backend the worst and the median ratio.

Compile caches are the machine's (shared by every server, as on a node whose pods share a
cache volume), so a configuration pays the warmup's compiles, not every JIT from scratch.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shlex
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from first_request_generate import _warm_client, server_process
from first_request_options import METRICS_PORT, _after_ready

K_RANGE = (0, 4)
SEQS_RANGE = (1, 128)
BUDGET_RANGE = (256, 8192)
MODEL_LEN_RANGE = (512, 16384)
BLOCK_SIZES = (16, 32)
MAX_PROMPT = 2048  # prompts stay short enough that a request's TTFT is one step or a few


@dataclass(frozen=True)
class ServerShape:
    k: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int
    prompt_len: int

    def flags(self) -> list[str]:
        return ["--num-speculative-steps", str(self.k), "--max-num-seqs", str(self.max_num_seqs),
                "--max-num-batched-tokens", str(self.max_num_batched_tokens),
                "--max-model-len", str(self.max_model_len), "--block-size", str(self.block_size)]

    def describe(self) -> str:
        return (f"k={self.k} seqs={self.max_num_seqs} budget={self.max_num_batched_tokens} "
                f"len={self.max_model_len} block={self.block_size} prompt={self.prompt_len}")


def draw_shape(rng: random.Random, max_tokens: int, model_len_cap: int) -> ServerShape:
    """A random configuration that can serve its prompt plus max_tokens."""
    model_len = rng.randint(MODEL_LEN_RANGE[0], min(MODEL_LEN_RANGE[1], model_len_cap))
    prompt_cap = max(1, min(MAX_PROMPT, model_len - max_tokens - K_RANGE[1] - 1))
    return ServerShape(k=rng.randint(*K_RANGE), max_num_seqs=rng.randint(*SEQS_RANGE),
                       max_num_batched_tokens=rng.randint(*BUDGET_RANGE),
                       max_model_len=model_len, block_size=rng.choice(BLOCK_SIZES),
                       prompt_len=rng.randint(1, prompt_cap))


def parse_shape(text: str) -> ServerShape:
    values = [int(v) for v in text.split()]
    if len(values) != 6:
        raise argparse.ArgumentTypeError("--config takes six integers: K SEQS BUDGET LEN BLOCK "
                                          "PROMPT")
    return ServerShape(*values)


@dataclass
class Timed:
    """One request: client-side seconds to its first token, and the mean gap between its
    tokens after the first (its decode steps)."""

    ttft_s: float
    decode_step_s: float


@dataclass
class ConfigResult:
    backend: str
    shape: ServerShape
    ready_s: float
    first: Timed
    steady: list[Timed] = field(default_factory=list)
    compiles_after_ready: int = 0
    graph_misses_after_ready: int = 0

    @property
    def steady_ttft_s(self) -> float:
        return statistics.median(t.ttft_s for t in self.steady)

    @property
    def steady_step_s(self) -> float:
        return _finite_median([t.decode_step_s for t in self.steady])

    @property
    def ttft_ratio(self) -> float:
        return self.first.ttft_s / self.steady_ttft_s

    @property
    def step_ratio(self) -> float:
        return self.first.decode_step_s / self.steady_step_s


def _finite_median(values: Sequence[float]) -> float:
    """The median of the values that are numbers; NaN when none is."""
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else math.nan


def timed_request(client: object, prompt: list[int], max_tokens: int, timeout: float) -> Timed:
    start = time.perf_counter()
    arrivals: list[float] = []
    for message in client.generate(prompt, max_tokens=max_tokens,  # type: ignore[attr-defined]
                                   ignore_eos=True, timeout=timeout):
        if message.token_ids:
            arrivals.extend([time.perf_counter()] * len(message.token_ids))
    if len(arrivals) < 2:
        raise RuntimeError(f"the stream produced {len(arrivals)} tokens; need 2 to time a "
                           "decode step")
    # A reader slower than the steps gets queued tokens in one message (the server coalesces
    # them): with every token in the first message there is no gap to time, NaN and not 0.
    spread = arrivals[-1] - arrivals[0]
    return Timed(arrivals[0] - start, spread / (len(arrivals) - 1) if spread else math.nan)


def measure(backend: str, shape: ServerShape, args: argparse.Namespace,
            rng: random.Random) -> ConfigResult:
    from warmgate.client.api import WaitResult, WarmgateClient

    flags = [*shlex.split(args.server_args), "--model", args.model, "--device", args.device,
             "--attention-backend", backend, "--metrics-port", "0", *shape.flags()]
    vocab = args.vocab_size

    def prompt() -> list[int]:
        return [rng.randrange(vocab) for _ in range(shape.prompt_len)]

    with server_process(flags, keep_caches=True) as server, \
            WarmgateClient(server.target, timeout=args.ready_timeout) as client:
        metrics_port = int(server.wait_for(METRICS_PORT).group(1))
        if client.wait_ready(args.ready_timeout) is not WaitResult.READY:
            status = client.get_status()
            raise RuntimeError(f"not ready: {status.failure_reason}\n{server.log_tail()}")
        ready_s = time.perf_counter() - server.started
        _warm_client(client)
        time.sleep(args.gap_s)
        first = timed_request(client, prompt(), args.max_tokens, args.request_timeout)
        steady = []
        for _ in range(args.repeats):
            time.sleep(args.gap_s)
            steady.append(timed_request(client, prompt(), args.max_tokens,
                                        args.request_timeout))
        after_ready = _after_ready(metrics_port)
    return ConfigResult(backend, shape, ready_s, first, steady,
                        compiles_after_ready=int(after_ready["compiles"]),
                        graph_misses_after_ready=int(after_ready["graph_misses"]))


def _nan_last(value: float) -> float:
    """A sort key that puts an untimed (NaN) ratio below every timed one."""
    return -math.inf if math.isnan(value) else value


def report(results: Sequence[ConfigResult]) -> list[str]:
    lines = [f"{'backend':<11} {'configuration':<58} {'ready s':>7} {'TTFT first':>10} "
             f"{'steady':>8} {'ratio':>6} {'step first':>10} {'steady':>8} {'ratio':>6} "
             f"{'compiles':>8} {'misses':>6}"]
    for r in sorted(results, key=lambda r: -r.ttft_ratio):
        lines.append(
            f"{r.backend:<11} {r.shape.describe():<58} {r.ready_s:7.1f} "
            f"{r.first.ttft_s * 1e3:8.2f}ms {r.steady_ttft_s * 1e3:6.2f}ms {r.ttft_ratio:6.2f} "
            f"{r.first.decode_step_s * 1e3:8.2f}ms {r.steady_step_s * 1e3:6.2f}ms "
            f"{r.step_ratio:6.2f} {r.compiles_after_ready:8d} {r.graph_misses_after_ready:6d}")
    for backend in sorted({r.backend for r in results}):
        ratios = [r.ttft_ratio for r in results if r.backend == backend]
        steps = [r.step_ratio for r in results if r.backend == backend]
        lines.append(f"{backend}: {len(ratios)} configurations; first/steady TTFT worst "
                     f"{max(ratios):.2f}, median {statistics.median(ratios):.2f}; first/steady "
                     f"decode step worst {max(steps, key=_nan_last):.2f}, median "
                     f"{_finite_median(steps):.2f}")
    return lines


def _parser(prog: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="warmgate-server's --model")
    p.add_argument("--device", default="auto", help="warmgate-server's --device")
    p.add_argument("--backends", default="torch",
                   help="comma-separated attention backends, each gets --configs servers")
    p.add_argument("--configs", type=int, default=12, help="configurations per backend")
    p.add_argument("--config", type=parse_shape, default=None,
                   help='one fixed configuration instead of random ones: "K SEQS BUDGET LEN '
                        'BLOCK PROMPT"')
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=16, help="tokens per request (>= 2)")
    p.add_argument("--repeats", type=int, default=10, help="steady requests per server")
    p.add_argument("--gap-s", type=float, default=0.5, help="idle seconds before each request")
    p.add_argument("--max-model-len-cap", type=int, default=MODEL_LEN_RANGE[1],
                   help="draw --max-model-len up to this (a preset's positions can be fewer)")
    p.add_argument("--vocab-size", type=int, default=256,
                   help="prompt token ids are drawn below this")
    p.add_argument("--server-args", default="", help="more warmgate-server flags, one string")
    p.add_argument("--ready-timeout", type=float, default=900.0)
    p.add_argument("--request-timeout", type=float, default=120.0)
    p.add_argument("--json", default=None, help="also write every result to this file")
    return p


def main(argv: list[str], prog: str | None = None) -> int:
    args = _parser(prog).parse_args(argv)
    if args.max_tokens < 2 or args.repeats < 1 or args.configs < 1:
        raise SystemExit("--max-tokens must be >= 2, --repeats and --configs >= 1")
    rng = random.Random(args.seed)
    results: list[ConfigResult] = []
    failures: list[str] = []
    for backend in args.backends.split(","):
        for i in range(args.configs):
            shape = args.config or draw_shape(rng, args.max_tokens, args.max_model_len_cap)
            print(f"[{backend} {i + 1}/{args.configs}] {shape.describe()}", flush=True)
            try:
                result = measure(backend, shape, args, rng)
            except Exception as exc:  # a refused or failed server: say so, go on
                print(f"  FAILED: {str(exc).strip().splitlines()[0][:300]}", flush=True)
                failures.append(f"{backend} {shape.describe()}: {exc}")
                continue
            print(f"  ready {result.ready_s:.1f} s; first/steady TTFT {result.ttft_ratio:.2f} "
                  f"({result.first.ttft_s * 1e3:.2f} / {result.steady_ttft_s * 1e3:.2f} ms), "
                  f"decode step {result.step_ratio:.2f}; compiles after ready "
                  f"{result.compiles_after_ready}, graph misses "
                  f"{result.graph_misses_after_ready}", flush=True)
            results.append(result)
    if results:
        print("\n".join(report(results)))
    for failure in failures:
        print(f"failed: {failure.splitlines()[0][:300]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{**asdict(r), "ttft_ratio": r.ttft_ratio, "step_ratio": r.step_ratio}
                       for r in results], f, indent=1)
    return 1 if failures else 0
