"""--deterministic: are the probes' tokens and logprobs the same bits alone and inside a
random busy workload, and what does the mode cost against the default?

    python bench/serve.py determinism [--probes 20 --tokens 32 --busy-requests 600 \
        --streams 64] (and any runner flag: --model, --device cuda, --attention-backend,
        --num-speculative-steps, ...; default: the tiny model on the CPU)

For each mode (deterministic, then default) a runner is built and warmed by the server's own
plan (the determinism phase included), then served in-process by the serving scheduler and
loop (n-gram drafts when k > 0):
  probes      each of --probes seeded random prompts (half greedy, half seeded sampling; all
              with logprobs) alone for --tokens tokens, then all of them at random places
              inside --busy-requests random requests (prompt 1..512 tokens, 1..64 new tokens,
              greedy, seeded and unseeded sampling, some with logprobs) submitted at once;
              `equal K/N` counts the probes whose tokens AND logprobs match bit for bit
  throughput  --streams requests of 128 prompt tokens x 128 new tokens at once: output tok/s
  batch-1     one request, 128 prompt tokens x 64 new: time to first token and per output
              token after it
  after ready the JIT compiles and CUDA-graph misses the JIT monitor counted after the plan
The last lines print the two modes side by side and the cost (deterministic / default).
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from dataclasses import dataclass
from typing import Any

from warmgate.server.devtools.runner_setup import add_runner_args, build_and_warm, runner_config
from warmgate.server.runner.scheduler_output import SamplingParams
from warmgate.server.serving.limits import SchedulerLimits
from warmgate.server.serving.loop import ServingLoop
from warmgate.server.serving.ngram import NgramIndex
from warmgate.server.serving.request import ServingRequest, StepEvent
from warmgate.server.serving.scheduler import Scheduler

Output = list[tuple[int, float]]  # (token, logprob) per generated token


@dataclass
class ModeResult:
    mode: str
    equal: int
    first_diffs: list[str]
    throughput_tok_s: float
    ttft_ms: float
    tpot_ms: float
    compiles_after_ready: int
    graph_misses_after_ready: int
    determinism_phase: str


def serve(runner: Any, reqs: list[tuple[str, list[int], SamplingParams]]
          ) -> tuple[dict[str, Output], dict[str, ServingRequest], float]:
    """reqs submitted at once, run to the end: per request its (token, logprob)s, the
    requests, and the wall seconds."""
    events: list[StepEvent] = []
    loop = ServingLoop(runner, Scheduler(SchedulerLimits.of_config(runner.config)),
                       events.extend)
    k = runner.num_speculative_steps
    start = time.perf_counter()
    handles = {}
    for rid, prompt, params in reqs:
        handles[rid] = ServingRequest(rid, list(prompt), params, time.perf_counter(),
                                      NgramIndex(1, 4) if k else None)
        loop.submit(handles[rid])
    loop.run(lambda: False)
    seconds = time.perf_counter() - start
    out: dict[str, Output] = {rid: [] for rid in handles}
    for e in events:
        if e.logprobs:
            out[e.req_id] += [(lp.token_id, lp.logprob) for lp in e.logprobs]
    return out, handles, seconds


def probes(rng: random.Random, n: int, tokens: int, vocab: int, max_prompt: int
           ) -> list[tuple[str, list[int], SamplingParams]]:
    out = []
    for i in range(n):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(4, max_prompt))]
        params = (SamplingParams(temperature=0.0, max_tokens=tokens, logprobs=1) if i % 2 == 0
                  else SamplingParams(temperature=0.8, top_p=0.95, seed=rng.randrange(2**31),
                                      max_tokens=tokens, logprobs=1))
        out.append((f"probe{i}", prompt, params))
    return out


def busy(rng: random.Random, n: int, vocab: int, max_prompt: int
         ) -> list[tuple[str, list[int], SamplingParams]]:
    out = []
    for i in range(n):
        new = rng.randint(1, 64)
        params = rng.choice([SamplingParams(temperature=0.0, max_tokens=new),
                             SamplingParams(temperature=1.0, max_tokens=new, logprobs=2),
                             SamplingParams(temperature=0.7, top_k=50, max_tokens=new,
                                            seed=rng.randrange(2**31))])
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, max_prompt))]
        out.append((f"busy{i}", prompt, params))
    return out


def first_difference(a: Output, b: Output) -> str:
    for j, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"position {j}: {x} alone, {y} busy"
    return f"length {len(a)} alone, {len(b)} busy"


def measure(args: argparse.Namespace, deterministic: bool) -> ModeResult:
    config = runner_config(args, deterministic=deterministic)
    runner, report, monitor = build_and_warm(config)
    phase = report.phase("determinism")
    vocab = config.model.vocab_size
    max_prompt = max(4, min(512, config.model.max_model_len - 64 - args.tokens - 8))
    rng = random.Random(args.seed)
    probe_reqs = probes(rng, args.probes, args.tokens, vocab, max_prompt)
    alone = {rid: serve(runner, [(rid, p, sp)])[0][rid] for rid, p, sp in probe_reqs}
    workload = busy(rng, args.busy_requests, vocab, max_prompt)
    for req in probe_reqs:
        workload.insert(rng.randrange(len(workload) + 1), req)
    got = serve(runner, workload)[0]
    diffs = [f"{rid}: {first_difference(alone[rid], got[rid])}"
             for rid, _, _ in probe_reqs if alone[rid] != got[rid]]
    prompt = [rng.randrange(vocab) for _ in range(min(128, max_prompt))]
    streams = [(f"s{i}", prompt, SamplingParams(temperature=0.0, max_tokens=128))
               for i in range(args.streams)]
    _, done, seconds = serve(runner, streams)
    throughput = sum(len(r.output_token_ids) for r in done.values()) / seconds
    _, one, wall = serve(runner, [("b1", prompt, SamplingParams(temperature=0.0,
                                                                max_tokens=64))])
    b1 = one["b1"]
    first = b1.usage.first_token_s if b1.usage.first_token_s is not None else b1.arrival_s
    last = b1.arrival_s + wall
    counts = monitor.snapshot()
    result = ModeResult(
        mode="deterministic" if deterministic else "default", equal=args.probes - len(diffs),
        first_diffs=diffs, throughput_tok_s=throughput,
        ttft_ms=1e3 * (first - b1.arrival_s),
        tpot_ms=1e3 * (last - first) / max(1, len(b1.output_token_ids) - 1),
        compiles_after_ready=counts.total_after_ready,
        graph_misses_after_ready=counts.graph_misses_after_ready,
        determinism_phase=f"{phase.status.value} {phase.detail}")
    monitor.close()
    del runner
    gc.collect()
    _free_cuda()
    return result


def _free_cuda() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add_runner_args(p)
    p.add_argument("--probes", type=int, default=20)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--busy-requests", type=int, default=600)
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    results = [measure(args, True), measure(args, False)]
    for r in results:
        print(f"[{r.mode}] determinism phase: {r.determinism_phase}")
        print(f"[{r.mode}] probes equal alone vs busy ({args.busy_requests} requests): "
              f"{r.equal}/{args.probes} (tokens and logprobs, bit for bit)")
        for d in r.first_diffs[:5]:
            print(f"[{r.mode}]   differs: {d}")
    det, default = results
    print(f"{'':28}{'deterministic':>16}{'default':>16}{'det/default':>14}")
    rows = [("probes equal", f"{det.equal}/{args.probes}", f"{default.equal}/{args.probes}", ""),
            (f"throughput {args.streams} streams tok/s", f"{det.throughput_tok_s:.1f}",
             f"{default.throughput_tok_s:.1f}",
             f"{det.throughput_tok_s / default.throughput_tok_s:.3f}"),
            ("batch-1 TTFT ms", f"{det.ttft_ms:.2f}", f"{default.ttft_ms:.2f}",
             f"{det.ttft_ms / default.ttft_ms:.3f}"),
            ("batch-1 per token ms", f"{det.tpot_ms:.3f}", f"{default.tpot_ms:.3f}",
             f"{det.tpot_ms / default.tpot_ms:.3f}"),
            ("compiles after ready", str(det.compiles_after_ready),
             str(default.compiles_after_ready), ""),
            ("graph misses after ready", str(det.graph_misses_after_ready),
             str(default.graph_misses_after_ready), "")]
    for name, a, b, ratio in rows:
        print(f"{name:28}{a:>16}{b:>16}{ratio:>14}")


if __name__ == "__main__":
    main()
