"""Decode step latency on the GPU: CUDA graphs vs eager, the attention backends side by side,
and each step against the HBM roofline of the parameters it reads.

    python bench/serve.py decode-latency [--model llama-3.2-1b | qwen3-30b-a3b | mixtral-8x7b]
        [--layers N] [--backends torch,triton,flashinfer] [--grouped-moe] [--pdl off|on|both]

For every backend one runner is built (random weights), its requests prefilled, decode steps
timed eagerly, then graphs captured and the same steps timed again. A MoE model's fused kernel
gets its launches first, as the warmup's moe phase gives them (an autotune per token-count
bucket). Prints one table of medians and the ratios (graph/eager per backend; each backend
against torch at the same size) and, per batch size, the roofline: the least time a step can
take reading its ACTIVE parameters (dense, attention and, of a MoE layer, the experts a batch
of B tokens touches: E * (1 - (1 - k/E)^B) expected distinct of E with top-k) and every
stream's KV cache from HBM (devtools/roofline.py). `--layers N` builds only the first N decoder
layers (the roofline counts the same N): the full 48 layers of qwen3-30b-a3b take minutes to
initialise on the device for each backend, and a decode step is layer after identical layer.

`--grouped-moe` (a MoE model) times each backend a second time, on the same runner and graphs
captured again, with the small token-count buckets that take the per-slot experts
(kernels.moe_gemv) forced onto the grouped GEMMs they replaced: rows "<backend>/grouped", the
two MoE paths side by side in one run.

`--pdl both` builds each backend's runner twice, without and with --pdl (programmatic dependent
launch of the Triton kernels, kernels/pdl.py; compute capability 9.0+), one after the other:
rows "<backend>/pdl" beside "<backend>", and a table of each graphed step with PDL against
without. `--pdl on` times the PDL runners alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from statistics import median

import torch

from warmgate.server.config.moe_kernel import grouped_launch
from warmgate.server.config.numerics_config import NumericsConfig
from warmgate.server.config.presets import MODEL_PRESETS
from warmgate.server.config.runner_config import (
    CacheConfig,
    CompilationConfig,
    ConfigError,
    DeviceConfig,
    ModelConfig,
    RunnerConfig,
    SchedulerConfig,
    resolve_runner_config,
)
from warmgate.server.core.results import PhaseStatus
from warmgate.server.devtools.batch_driver import BatchDriver, DrivenRequest, Work
from warmgate.server.devtools.gpu_card import detect
from warmgate.server.devtools.roofline import Roofline
from warmgate.server.runner.attention import backend_available
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.runner.scheduler_output import GREEDY
from warmgate.server.warmup.moe_phase import run_moe_warmup

SIZES = (1, 8, 64)


def model_config(model: str, max_len: int, layers: int | None) -> ModelConfig:
    """The preset at max_len, with its first `layers` decoder layers only when given."""
    overrides = {} if layers is None else {"num_layers": layers}
    return ModelConfig.from_preset(model, max_model_len=max_len, **overrides)


def roofline_ms(model: ModelConfig, sizes: tuple[int, ...], context: float,
                bytes_per_s: float) -> dict[int, float]:
    """{batch: the roofline step in ms} for decode batches of one token per stream, each
    stream's KV cache `context` tokens long on average (bf16 weights and cache; an FP8
    preset's projections at one byte and their scales, devtools.roofline)."""
    return {n: 1000 * Roofline.of(model, n, context, bytes_per_s=bytes_per_s).step_s
            for n in sizes}


def bench_config(model: str, backend: str, prompt_len: int, decode_tokens: int,
                 layers: int | None = None, deterministic: bool = False,
                 pdl: bool = False, mixed_prompt: int = 0,
                 sizes: tuple[int, ...] = SIZES) -> RunnerConfig:
    """The configuration of build's runner: room for max(sizes) requests of prompt_len +
    decode_tokens tokens and graphs at `sizes`, and room for one more request of
    mixed_prompt tokens beside them."""
    max_reqs = max(sizes)
    max_len = max(prompt_len + decode_tokens, mixed_prompt) + 16
    per_req = -(-max_len // 16)
    return RunnerConfig(
        model=model_config(model, max_len, layers),
        cache=CacheConfig(block_size=16, num_blocks=max_reqs * per_req + 2
                          + -(-mixed_prompt // 16)),
        scheduler=SchedulerConfig(
            max_num_seqs=max_reqs + (1 if mixed_prompt else 0),
            max_num_batched_tokens=max(2048, prompt_len * 8, mixed_prompt + max_reqs)),
        device=DeviceConfig(device="cuda", dtype="bfloat16", attention_backend=backend),
        compilation=CompilationConfig(cuda_graph_sizes=tuple(sorted(set(sizes))), pdl=pdl),
        numerics=NumericsConfig(deterministic=deterministic))


def build(model: str, backend: str, prompt_len: int, decode_tokens: int,
          layers: int | None = None, deterministic: bool = False,
          pdl: bool = False, mixed_prompt: int = 0,
          sizes: tuple[int, ...] = SIZES) -> ModelRunner:
    """A runner of bench_config's (the mixed_prompt request is mixed_s's); deterministic:
    --deterministic's batch-invariant kernels; pdl: --pdl (the runner sets the process's
    launch switch, so runners with and without it are timed one after the other); sizes: the
    batches it holds and captures graphs at (step-kernels' --batches). ConfigError where
    --pdl cannot run."""
    return ModelRunner(resolve_runner_config(bench_config(
        model, backend, prompt_len, decode_tokens, layers, deterministic, pdl, mixed_prompt,
        sizes)))


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


def _sync(driver: BatchDriver) -> None:
    if driver.runner.device.type == "cuda":
        torch.cuda.synchronize()


def _timed_step(driver: BatchDriver, plan: dict[str, Work]) -> float:
    """The wall seconds of execute_model + sample_tokens on `plan`, synced; the batch is built
    before the clock starts."""
    so = driver.build_output(plan)
    _sync(driver)
    start = time.perf_counter()
    out = driver.runner.execute_model(so)
    if out is None:
        out = driver.runner.sample_tokens(None)
    _sync(driver)
    seconds = time.perf_counter() - start
    driver.apply_output(out)
    return seconds


def decode_s(driver: BatchDriver, reqs: list[DrivenRequest]) -> float:
    """One decode step of `reqs` (k dummy drafts each with speculation), timed."""
    k = driver.runner.num_speculative_steps
    return _timed_step(driver, {r.req_id: Work(1 + k, (1,) * k) for r in reqs})


def mixed_s(driver: BatchDriver, reqs: list[DrivenRequest], prompt_len: int,
            req_id: str) -> float:
    """One step of `reqs`' decodes beside the whole prompt_len-token prompt of a new request
    `req_id`, timed: the step a server takes when a prompt arrives among streams that decode
    (at many streams these set the ITL's tail). The new request ends with the step, its KV
    blocks back in the pool for the next one."""
    k = driver.runner.num_speculative_steps
    driver.add(DrivenRequest(req_id, [(5 * j + 1) % 1000 for j in range(prompt_len)], GREEDY,
                             max_new_tokens=1))
    plan = {r.req_id: Work(1 + k, (1,) * k) for r in reqs}
    plan[req_id] = Work(prompt_len)
    seconds = _timed_step(driver, plan)
    driver.finish(req_id)
    return seconds


def median_decode_ms(driver: BatchDriver, reqs: list[DrivenRequest], steps: int,
                     warmup: int = 3) -> float:
    for _ in range(warmup):
        decode_s(driver, reqs)
    return 1000 * median(decode_s(driver, reqs) for _ in range(steps))


def force_grouped_moe(runner: ModelRunner) -> str:
    """Put every per-slot bucket of the runner's MoE launches on the grouped GEMMs; returns
    what changed ("" when nothing did: a dense model, or no per-slot bucket)."""
    launches = runner.model.moe_launches
    if launches is None:
        return ""
    forced = {b: grouped_launch(b, launches.shape, launches.max_tokens)
              for b, launch in launches.chosen.items() if launch.per_slot}
    launches.preset(forced)
    return ", ".join(f"<={b}: {launch}" for b, launch in sorted(forced.items()))


def time_backend(runner: ModelRunner, driver: BatchDriver, reqs: list[DrivenRequest],
                 steps: int) -> dict[str, dict[int, float]]:
    """Eager steps at every size, then graphs captured (again, if they were) and graphed."""
    runner.graph_runner = None  # eager: a capture of other launches is replaced below
    eager = {n: median_decode_ms(driver, reqs[:n], steps) for n in SIZES}
    runner.capture_cuda_graphs()
    graph = {n: median_decode_ms(driver, reqs[:n], steps) for n in SIZES}
    return {"eager": eager, "graph": graph}


def format_table(results: dict[str, dict[str, dict[int, float]]], roof: dict[int, float]
                 ) -> str:
    """The medians, their ratios and the roofline: a row per backend and batch size; the
    ratios to torch where torch ran."""
    lines = [f"{'backend':<19}{'batch':>6}{'eager':>9}{'graph':>9}{'graph/eager':>13}"
             f"{'eager/torch':>13}{'graph/torch':>13}{'roofline':>10}{'graph/roof':>12}"]
    torch_r = results.get("torch")
    for backend, r in results.items():
        for n in sorted(r["eager"]):
            e, g = r["eager"][n], r["graph"][n]
            vs = (f"{e / torch_r['eager'][n]:>13.2f}{g / torch_r['graph'][n]:>13.2f}"
                  if torch_r is not None else f"{'-':>13}{'-':>13}")
            lines.append(f"{backend:<19}{n:>6}{e:>9.3f}{g:>9.3f}{g / e:>13.2f}{vs}"
                         f"{roof[n]:>10.3f}{g / roof[n]:>12.2f}")
    return "\n".join(lines)


PDL_ARMS = {"off": (False,), "on": (True,), "both": (False, True)}


def pdl_table(results: dict[str, dict[str, dict[int, float]]]) -> str:
    """Each graphed step with --pdl against the same backend's without it, where both ran."""
    lines = [f"{'backend':<19}{'batch':>6}{'graph':>9}{'graph/pdl':>11}{'pdl/off':>9}"]
    for name, r in results.items():
        off = results.get(name.removesuffix("/pdl")) if name.endswith("/pdl") else None
        for n in sorted(r["graph"]) if off is not None else ():
            lines.append(f"{name.removesuffix('/pdl'):<19}{n:>6}{off['graph'][n]:>9.3f}"
                         f"{r['graph'][n]:>11.3f}{r['graph'][n] / off['graph'][n]:>9.2f}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama-3.2-1b", choices=sorted(MODEL_PRESETS),
                   help="a preset (random weights; the MoE presets too)")
    p.add_argument("--layers", type=int, default=None,
                   help="build only the first N decoder layers (default: the preset's)")
    p.add_argument("--backends", default="torch,triton,flashinfer",
                   help="comma-separated; those not installed are left out")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--json", default=None, help="also write the numbers here")
    p.add_argument("--grouped-moe", action="store_true",
                   help="a MoE model: also time each backend with its per-slot buckets on the "
                        "grouped GEMMs (rows '<backend>/grouped')")
    p.add_argument("--pdl", default="off", choices=sorted(PDL_ARMS),
                   help="time each backend without --pdl (off), with it (on, rows "
                        "'<backend>/pdl'), or both, one runner after the other")
    args = p.parse_args()
    if args.layers is not None and args.layers < 1:
        p.error("--layers must be at least 1")
    if not torch.cuda.is_available():
        print("decode_latency needs a CUDA device", file=sys.stderr)
        return 2
    card = detect("cuda")  # before any model: the copy check needs 2 GiB free
    print(card.describe(), flush=True)
    backends = [b for b in args.backends.split(",") if b == "torch" or backend_available(b)]
    if not backends:
        p.error(f"--backends {args.backends}: none of them is installed")
    results: dict[str, dict[str, dict[int, float]]] = {}
    for backend, pdl in [(b, on) for b in backends for on in PDL_ARMS[args.pdl]]:
        # Request 0 decodes in every timed step: eager and graphed, every size, warm-ups too,
        # twice with --grouped-moe.
        decode_steps = 2 * len(SIZES) * (args.steps + 3) * (2 if args.grouped_moe else 1)
        name = f"{backend}/pdl" if pdl else backend
        try:
            runner = build(args.model, backend, args.prompt_len, decode_steps, args.layers,
                           pdl=pdl)
        except ConfigError as exc:
            print(f"decode_latency: {name}: {exc.message}", file=sys.stderr)
            return 2
        moe = run_moe_warmup(runner)  # a MoE model's launches, as a warmup gives them
        if moe.status is PhaseStatus.RAN:
            print(f"{name}: {moe.detail}: {moe.shapes['launches']}", flush=True)
        driver = BatchDriver(runner)
        reqs = prefill(driver, max(SIZES), args.prompt_len, chunk=8)
        results[name] = time_backend(runner, driver, reqs, args.steps)
        forced = force_grouped_moe(runner) if args.grouped_moe else ""
        if forced:
            print(f"{name}/grouped: {forced}", flush=True)
            results[f"{name}/grouped"] = time_backend(runner, driver, reqs, args.steps)
        del driver, reqs, runner
        torch.cuda.empty_cache()

    config = model_config(args.model, args.prompt_len, args.layers)
    roof = roofline_ms(config, SIZES, args.prompt_len, bytes_per_s=card.bytes_per_s)
    layers = f", first {args.layers} layers" if args.layers is not None else ""
    print(f"\ndecode step latency, {args.model}{layers}, context ~{args.prompt_len} tokens, "
          f"median of {args.steps} steps (ms; execute_model + sample_tokens, synced); roofline "
          f"at {card.bytes_per_s / 1e12:.2f} TB/s ({card.slug})")
    print(format_table(results, roof))
    if args.pdl == "both":
        print("\nwith --pdl against without (graphed steps, ms)")
        print(pdl_table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "layers": args.layers,
                       "prompt_len": args.prompt_len, "results": results,
                       "roofline_ms": roof}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
