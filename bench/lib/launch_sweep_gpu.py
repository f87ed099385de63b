"""Every launch of the decode-sized kernels on a grid, timed on the GPU: which tiles, warps and
pipeline depths read a weight fastest, to set the plans (kernels/gemv_plan.py, the per-slot
MoE launch of config/moe_kernel.py) from this card's figures instead of their rules.

    python bench/serve.py launch-sweep [--models llama-3.1-8b,qwen3-30b-a3b,llama-3.2-1b]
                                       [--rows 1,8] [--workers 12] [--top 4] [--moe]

- The dense GEMV (kernels/dense_gemv.py): per projection shape and row count, every
  (BLOCK_N, BLOCK_K, warps, stages) of the grid for the row's bucket, beside cuBLAS and the
  plan's own launch. Each time is a CUDA graph's of one call per layer copy (graph_timing),
  as a fraction of the card's bandwidth.
- --moe: the per-slot MoE kernels at one token (kernels/moe_gemv.py, qwen3-30b-a3b's experts):
  every gate/up launch of the grid with every down N tile, each call on another layer's
  routing (different experts, so the 75 MB they read is not in L2).

The grid is compiled first by --workers processes at once (Triton's on-disk cache is shared,
so the timing loads every binary), since one process compiling ~1,000 binaries would take the
whole run.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import multiprocessing as mp
import sys
import time

import torch
import torch.nn.functional as F
from graph_timing import graph_us, projection_shapes

MODELS = ("llama-3.1-8b", "qwen3-30b-a3b", "llama-3.2-1b")
# The MoE model's experts are not dense projections; its head reads at 0.93 already.
SHAPES = {"qwen3-30b-a3b": ("qkv", "o")}
DENSE_SHAPES = ("qkv", "o", "gate_up", "down")
MIN_WORKING_SET = 512 << 20
MAX_LAYERS = 64
MOE_LAYERS = 24


def dense_grid(n: int, k: int, m: int) -> list[object]:
    """The GemvLaunch grid for (N, K) at m rows: unsplit launches of every tile and depth."""
    from warmgate.server.kernels.gemv_plan import GemvLaunch, rows_bucket

    block_m = rows_bucket(m)
    widths = (4, 8, 16) if block_m == 1 else (16, 32, 64)
    depths = (256, 512) if block_m == 1 else (64, 128, 256)
    warps = (4, 8) if block_m == 1 else (4,)
    out = []
    for block_n, block_k, num_warps, stages in itertools.product(widths, depths, warps,
                                                                  (2, 3, 4)):
        if block_k <= k and block_n <= n:
            out.append(GemvLaunch(block_m=block_m, block_n=block_n, block_k=block_k, splits=1,
                                  k_per_split=k, num_warps=num_warps, num_stages=stages))
    return out


def moe_grid() -> list[tuple[object, int]]:
    """(per-slot MoELaunch, down kernel's N tile) pairs. Narrow tiles with long K steps too
    (N4 x K512, three stages): at one row the dense GEMV's fastest launches read 1 KB of a
    weight row a step, where the table's per-slot launch reads 256 B."""
    from warmgate.server.config.moe_kernel import GEMV_BLOCK_M, MoELaunch

    return [(MoELaunch(GEMV_BLOCK_M, block_n, block_k, warps, stages), down_n)
            for block_n, block_k, warps, stages, down_n in itertools.product(
                (4, 8, 16, 32), (128, 256, 512), (4, 8), (1, 2, 3), (1, 2, 4, 8))]


def _compile_dense(jobs: list[tuple[int, int, int, object]]) -> int:
    from warmgate.server.kernels.dense_gemv import dense_gemv

    done = 0
    for n, k, m, launch in jobs:
        w = torch.zeros(n, k, device="cuda", dtype=torch.bfloat16)
        try:
            dense_gemv(torch.zeros(m, k, device="cuda", dtype=torch.bfloat16), w,
                       launch=launch)  # type: ignore[arg-type]
            done += 1
        except Exception:  # out of resources: the timing skips it too
            pass
    torch.cuda.synchronize()
    return done


def _compile_moe(jobs: list[tuple[object, int]]) -> int:
    done = 0
    for launch, down_n in jobs:
        try:
            run_moe(_moe_case(1, 0), 0, launch, down_n)
            done += 1
        except Exception:
            pass
    torch.cuda.synchronize()
    return done


def precompile(fn_name: str, jobs: list, workers: int) -> None:
    """Run this module's fn_name over jobs in `workers` spawned processes (each its own CUDA
    context). The function goes by this module's import name: run through bench/serve.py,
    the script's own functions live in a __main__ the children do not have."""
    import launch_sweep_gpu  # this file, by the name the children can import

    start = time.perf_counter()
    chunks = [jobs[i::workers] for i in range(workers)]
    with mp.get_context("spawn").Pool(workers) as pool:
        done = sum(pool.map(getattr(launch_sweep_gpu, fn_name), chunks))
    print(f"  compiled {done}/{len(jobs)} launches in {time.perf_counter() - start:.0f} s "
          f"({workers} processes)", flush=True)


def sweep_dense(model: str, rows: list[int], bandwidth: float, workers: int, top: int,
                gen: torch.Generator) -> None:
    from warmgate.server.kernels.matmul_plan import device_sm_count

    projections, _ = projection_shapes(model)
    names = SHAPES.get(model, DENSE_SHAPES)
    sms = device_sm_count(torch.device("cuda"))
    jobs = [(n, k, m, launch) for name in names for n, k in [projections[name]] for m in rows
            for launch in dense_grid(n, k, m)]
    print(f"\n== {model}: {', '.join(names)} at M in {rows}", flush=True)
    precompile("_compile_dense", jobs, workers)
    for name in names:
        _sweep_shape(name, *projections[name], rows, bandwidth, sms, top, gen)


def _sweep_shape(name: str, n: int, k: int, rows: list[int], bandwidth: float, sms: int,
                 top: int, gen: torch.Generator) -> None:
    """One weight shape: cuBLAS, the plan's launch and the grid's fastest, per row count."""
    from warmgate.server.kernels.dense_gemv import dense_gemv
    from warmgate.server.kernels.gemv_plan import gemv_launch

    nbytes = n * k * 2
    layers = max(2, min(MAX_LAYERS, MIN_WORKING_SET // nbytes))
    weights = [torch.randn(n, k, device="cuda", generator=gen, dtype=torch.bfloat16)
               for _ in range(layers)]

    def frac(us: float) -> float:
        return nbytes / us / 1e-6 / bandwidth

    for m in rows:
        x = torch.randn(m, k, device="cuda", generator=gen, dtype=torch.bfloat16)
        cublas = graph_us(lambda i, x=x: F.linear(x, weights[i]), layers)
        plan = gemv_launch(n, k, m, 2, sms)
        planned = graph_us(lambda i, x=x, a=plan: dense_gemv(x, weights[i], launch=a), layers)
        timed = []
        for launch in dense_grid(n, k, m):
            try:
                us = graph_us(lambda i, x=x, a=launch: dense_gemv(x, weights[i], launch=a),
                              layers, replays=7)
            except Exception:  # out of resources on this card: not a candidate
                continue
            timed.append((us, launch))
        timed.sort(key=lambda t: t[0])
        print(f"{name} N={n} K={k} M={m}: cuBLAS {cublas:.1f} us ({frac(cublas):.2f}), "
              f"plan {_label(plan)} {planned:.1f} us ({frac(planned):.2f}), best of "
              f"{len(timed)}:", flush=True)
        for us, launch in timed[:top]:
            print(f"    {_label(launch):>22} {us:7.1f} us {frac(us):.2f}", flush=True)
    weights.clear()
    torch.cuda.empty_cache()


def _label(launch: object) -> str:
    d = dataclasses.asdict(launch)  # type: ignore[call-overload]
    return (f"N{d['block_n']} K{d['block_k']} w{d['num_warps']} s{d['num_stages']}"
            + (f" S{d['splits']}" if d["splits"] > 1 else ""))


def _moe_case(layers: int, seed: int) -> dict[str, object]:
    """qwen3-30b-a3b's experts (one copy) with `layers` routings of one token."""
    from warmgate.server.config.runner_config import ModelConfig

    c = ModelConfig.from_preset("qwen3-30b-a3b")
    e, h, inter, top_k = (c.num_experts, c.hidden_size, c.moe_intermediate_size,
                          c.num_experts_per_tok)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    kw = dict(device="cuda", dtype=torch.bfloat16)
    return {"hidden": torch.randn(1, h, generator=gen, device="cuda").bfloat16(),
            "w13": torch.empty(e, 2 * inter, h, **kw).normal_(0, 0.02, generator=gen),
            "w2": torch.empty(e, h, inter, **kw).normal_(0, 0.02, generator=gen),
            "weights": torch.full((1, top_k), 1 / top_k, device="cuda"),
            "ids": [torch.randperm(e, generator=gen, device="cuda")[:top_k].view(1, top_k)
                    for _ in range(layers)]}


def run_moe(case: dict[str, object], layer: int, launch: object, down_n: int) -> torch.Tensor:
    """moe_gemv with the down kernel's N tile set to down_n."""
    from warmgate.server.kernels import moe_gemv

    real = moe_gemv.down_block_n
    moe_gemv.down_block_n = lambda launch, top_k: down_n  # type: ignore[assignment]
    try:
        return moe_gemv.moe_gemv(case["hidden"], case["w13"], case["w2"], case["weights"],
                                 case["ids"][layer], launch)  # type: ignore[index, arg-type]
    finally:
        moe_gemv.down_block_n = real


def sweep_moe(bandwidth: float, workers: int, top: int) -> None:
    from warmgate.server.config.moe_kernel import ExpertShape, table_launch
    from warmgate.server.config.runner_config import ModelConfig
    from warmgate.server.kernels.moe_gemv import down_block_n

    print("\n== qwen3-30b-a3b per-slot experts at one token (gate/up + down)", flush=True)
    grid = moe_grid()
    precompile("_compile_moe", grid, workers)
    case = _moe_case(MOE_LAYERS, 1)
    c = ModelConfig.from_preset("qwen3-30b-a3b")
    shape = ExpertShape(c.num_experts, c.num_experts_per_tok, c.hidden_size,
                        c.moe_intermediate_size)
    nbytes = 3 * c.num_experts_per_tok * c.moe_intermediate_size * c.hidden_size * 2
    table = table_launch(2, shape)
    planned = graph_us(lambda i: run_moe(case, i, table, down_block_n(table, shape.top_k)),
                       MOE_LAYERS)
    print(f"table {table} down N{down_block_n(table, shape.top_k)}: {planned:.1f} us "
          f"({nbytes / planned / 1e-6 / bandwidth:.2f} of {nbytes / 1e6:.1f} MB)")
    timed = []
    for launch, down_n in grid:
        try:
            us = graph_us(lambda i, a=launch, d=down_n: run_moe(case, i, a, d), MOE_LAYERS,
                          replays=7)
        except Exception:
            continue
        timed.append((us, launch, down_n))
    timed.sort(key=lambda t: t[0])
    print(f"best of {len(timed)}:")
    for us, launch, down_n in timed[:top]:
        print(f"    {launch!s:>24} down N{down_n} {us:7.1f} us "
              f"{nbytes / us / 1e-6 / bandwidth:.2f}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated presets")
    p.add_argument("--rows", default="1,8", help="row counts, each 1..16")
    p.add_argument("--workers", type=int, default=12, help="processes that compile the grid")
    p.add_argument("--top", type=int, default=4, help="fastest launches printed per case")
    p.add_argument("--moe", action="store_true", help="also the per-slot MoE kernels")
    args = p.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    if not all(1 <= r <= 16 for r in rows):
        p.error(f"--rows: each row count must be 1..16, got {args.rows}")
    if not torch.cuda.is_available():
        sys.exit("launch-sweep needs a CUDA device")
    from warmgate.server.devtools.gpu_card import detect

    card = detect("cuda")
    print(card.describe(), flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    if args.moe:
        sweep_moe(card.bytes_per_s, args.workers, args.top)
    for model in (m for m in args.models.split(",") if m):
        sweep_dense(model, rows, card.bytes_per_s, args.workers, args.top, gen)


if __name__ == "__main__":
    main()
