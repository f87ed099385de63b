"""Decode step latency on the GPU: CUDA graphs vs eager, and the attention backends side by side.

    python bench/serve.py decode-latency [--model llama-3.2-1b]

For every available backend one runner is built, its requests prefilled, decode steps timed
eagerly, then graphs captured and the same steps timed again. Prints one table of medians and
the ratios (graph/eager per backend; each backend against torch at the same size).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from statistics import median

import torch

from warmgate.server.config.runner_config import (
    CacheConfig,
    CompilationConfig,
    DeviceConfig,
    ModelConfig,
    RunnerConfig,
    SchedulerConfig,
    resolve_runner_config,
)
from warmgate.server.devtools.batch_driver import BatchDriver, DrivenRequest, Work
from warmgate.server.runner.attention import backend_available
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.runner.scheduler_output import GREEDY

SIZES = (1, 8, 64)


def build(model: str, backend: str, prompt_len: int, decode_tokens: int) -> ModelRunner:
    """A runner with room for max(SIZES) requests of prompt_len + decode_tokens tokens."""
    max_reqs = max(SIZES)
    max_len = prompt_len + decode_tokens + 16
    per_req = -(-max_len // 16)
    cfg = RunnerConfig(
        model=ModelConfig.from_preset(model, max_model_len=max_len),
        cache=CacheConfig(block_size=16, num_blocks=max_reqs * per_req + 2),
        scheduler=SchedulerConfig(max_num_seqs=max_reqs,
                                  max_num_batched_tokens=max(2048, prompt_len * 8)),
        device=DeviceConfig(device="cuda", dtype="bfloat16", attention_backend=backend),
        compilation=CompilationConfig(cuda_graph_sizes=SIZES))
    return ModelRunner(resolve_runner_config(cfg))


def prefill(driver: BatchDriver, num_reqs: int, prompt_len: int, chunk: int
            ) -> list[DrivenRequest]:
    """num_reqs greedy requests of prompt_len tokens, prefilled `chunk` requests per step."""
    reqs = [DrivenRequest(f"bench{i}", [(7 * j + 3) % 1000 for j in range(prompt_len)], GREEDY,
                          max_new_tokens=10**9) for i in range(num_reqs)]
    for start in range(0, num_reqs, chunk):
        for r in reqs[start:start + chunk]:
            driver.add(r)
        driver.step({r.req_id: Work(prompt_len) for r in reqs[start:start + chunk]})
    return reqs


def decode_s(driver: BatchDriver, reqs: list[DrivenRequest]) -> float:
    """One decode step of `reqs` (k dummy drafts each with speculation): the wall seconds of
    execute_model + sample_tokens, synced; the batch is built before the clock starts."""
    k = driver.runner.num_speculative_steps
    so = driver.build_output({r.req_id: Work(1 + k, (1,) * k) for r in reqs})
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = driver.runner.execute_model(so)
    if out is None:
        out = driver.runner.sample_tokens(None)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    driver.apply_output(out)
    return seconds


def median_decode_ms(driver: BatchDriver, reqs: list[DrivenRequest], steps: int,
                     warmup: int = 3) -> float:
    for _ in range(warmup):
        decode_s(driver, reqs)
    return 1000 * median(decode_s(driver, reqs) for _ in range(steps))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--json", default=None, help="also write the numbers here")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("decode_latency needs a CUDA device", file=sys.stderr)
        return 2
    backends = [b for b in ("torch", "triton", "flashinfer")
                if b == "torch" or backend_available(b)]
    results: dict[str, dict[str, dict[int, float]]] = {}
    for backend in backends:
        # Request 0 decodes in every timed step: eager and graphed, every size, warm-ups too.
        decode_steps = 2 * len(SIZES) * (args.steps + 3)
        runner = build(args.model, backend, args.prompt_len, decode_steps)
        driver = BatchDriver(runner)
        reqs = prefill(driver, max(SIZES), args.prompt_len, chunk=8)
        eager = {n: median_decode_ms(driver, reqs[:n], args.steps) for n in SIZES}
        runner.capture_cuda_graphs()
        graph = {n: median_decode_ms(driver, reqs[:n], args.steps) for n in SIZES}
        results[backend] = {"eager": eager, "graph": graph}
        del driver, reqs, runner
        torch.cuda.empty_cache()

    print(f"\ndecode step latency, {args.model}, context ~{args.prompt_len} tokens, "
          f"median of {args.steps} steps (ms; execute_model + sample_tokens, synced)")
    print(f"{'backend':<11}{'batch':>6}{'eager':>9}{'graph':>9}{'graph/eager':>13}"
          f"{'eager/torch':>13}{'graph/torch':>13}")
    for backend, r in results.items():
        for n in SIZES:
            e, g = r["eager"][n], r["graph"][n]
            te, tg = results["torch"]["eager"][n], results["torch"]["graph"][n]
            print(f"{backend:<11}{n:>6}{e:>9.3f}{g:>9.3f}{g / e:>13.2f}{e / te:>13.2f}"
                  f"{g / tg:>13.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "prompt_len": args.prompt_len, "results": results},
                      f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
