"""Decode-sized dense GEMMs on the GPU: cuBLAS (F.linear) against the Triton GEMV
(kernels/dense_gemv.py), per projection shape of llama-3.2-1b and llama-3.1-8b and per row
count, each as a fraction of the card's HBM bandwidth.

    python bench/serve.py dense-gemv [--models llama-3.2-1b,llama-3.1-8b] [--rows 1,4,8,16]
                                     [--sweep]

Each time is a CUDA graph's (the way decode runs: no launch overhead) of one call per "layer",
every layer with its own copy of the weight, so the weights cross HBM as a model's layers would
(the copies together are several times the L2). The fraction is the weight's bytes (x and the
output are a rounding error at these M) over the time, over the bandwidth of
devtools/gpu_card.py's table for the card. Beside them, what the warmup's timer
(runner/linear_timing.py: events around calls queued behind a sleep) measures for the same
pair, and which it would pick; the chooser is right where its pick is the graph's faster.
Then the down projection with SiLU-and-mul: the two launches against the GEMV with the
activation fused in. A last table sums a decode step's dense GEMMs (every layer's four
projections and the head) for cuBLAS alone, the GEMV alone and the faster per (shape, M).

--sweep: for each shape and row bucket, a few other GEMV launches (BLOCK_N, the K split) next
to gemv_plan's, to check its rules on this card.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import torch
import torch.nn.functional as F
from graph_timing import graph_us, projection_shapes

MODELS = ("llama-3.2-1b", "llama-3.1-8b")
ROWS = (1, 4, 8, 16)
MIN_WORKING_SET = 512 << 20
MAX_LAYERS = 64


def sweep_launches(plan: object, n: int, k: int) -> dict[str, object]:
    """Other launches for the plan's bucket: narrower and wider N tiles, other K splits."""
    from warmgate.server.kernels.gemv_plan import GemvLaunch, cdiv

    assert isinstance(plan, GemvLaunch)
    widths = (4, 8, 16, 32) if plan.block_m == 1 else (16, 32, 64)
    out: dict[str, object] = {}
    k_steps = cdiv(k, plan.block_k)
    for block_n in widths:
        for splits in (1, 2, 4):
            per = cdiv(k_steps, splits)
            s = cdiv(k_steps, per)
            launch = dataclasses.replace(plan, block_n=block_n, splits=s,
                                         k_per_split=per * plan.block_k if s > 1 else k)
            if launch != plan and cdiv(n, block_n) * s <= 1 << 16:
                out[f"N{block_n},S{s}"] = launch
    return out


def bench_shape(name: str, n: int, k: int, rows: list[int], bandwidth: float, sweep: bool,
                gen: torch.Generator) -> dict[int, tuple[float, float]]:
    """Print one shape's table; returns {M: (cuBLAS us, GEMV us)} per call."""
    from warmgate.server.kernels.dense_gemv import dense_gemv
    from warmgate.server.kernels.gemv_plan import gemv_launch
    from warmgate.server.kernels.linear_choices import LINEAR, MARGIN
    from warmgate.server.kernels.matmul_plan import device_sm_count
    from warmgate.server.runner.linear_timing import time_linears

    dev = torch.device("cuda")
    sms = device_sm_count(dev)
    nbytes = n * k * 2
    layers = max(2, min(MAX_LAYERS, MIN_WORKING_SET // nbytes))
    weights = [torch.randn(n, k, device=dev, generator=gen, dtype=torch.bfloat16) / k ** 0.5
               for _ in range(layers)]
    print(f"\n{name}: N={n} K={k} bf16, {nbytes / 1e6:.1f} MB, {layers} copies")
    print(f"{'M':>3} {'cuBLAS us':>10} {'frac':>5} {'GEMV us':>9} {'frac':>5} {'G/C':>5}  "
          f"{'timer C/G us':>14} {'pick':>6}  {'err':>7}  launch")
    found: dict[int, tuple[float, float]] = {}
    for m in rows:
        x = torch.randn(m, k, device=dev, generator=gen, dtype=torch.bfloat16)
        cublas = graph_us(lambda i, x=x: F.linear(x, weights[i]), layers)
        gemv = graph_us(lambda i, x=x: dense_gemv(x, weights[i]), layers)
        timer_c, timer_g = time_linears(weights, m, LINEAR)
        pick = "GEMV" if timer_g < timer_c * (1 - MARGIN) else "cuBLAS"
        ref = F.linear(x.float(), weights[0].float())
        err = ((dense_gemv(x, weights[0]).float() - ref).norm() / ref.norm()).item()
        launch = gemv_launch(n, k, m, 2, sms)
        print(f"{m:>3} {cublas:>10.1f} {nbytes / cublas / 1e-6 / bandwidth:>5.2f} "
              f"{gemv:>9.1f} {nbytes / gemv / 1e-6 / bandwidth:>5.2f} {gemv / cublas:>5.2f}  "
              f"{timer_c * 1e6:>6.1f}/{timer_g * 1e6:<7.1f} {pick:>6}  {err:>7.1e}  "
              f"N{launch.block_n} K{launch.block_k} S{launch.splits}")
        found[m] = (cublas, gemv)
        if sweep:
            for label, alt in sweep_launches(launch, n, k).items():
                us = graph_us(lambda i, x=x, a=alt: dense_gemv(x, weights[i], launch=a),
                              layers)
                print(f"{'':>3} {label:>27}: {us:>7.1f} us "
                      f"{nbytes / us / 1e-6 / bandwidth:>5.2f}")
    weights.clear()  # the next shape's copies need the memory
    torch.cuda.empty_cache()
    return found


def bench_fused_down(n: int, k: int, rows: list[int], gen: torch.Generator) -> None:
    """The MLP's SiLU-and-mul and down projection: the two launches (with either linear)
    against the GEMV with the activation fused in, us per call in a CUDA graph."""
    from warmgate.server.kernels.activation import silu_and_mul
    from warmgate.server.kernels.dense_gemv import dense_gemv, silu_mul_gemv

    dev = torch.device("cuda")
    layers = max(2, min(MAX_LAYERS, MIN_WORKING_SET // (n * k * 2)))
    weights = [torch.randn(n, k, device=dev, generator=gen, dtype=torch.bfloat16) / k ** 0.5
               for _ in range(layers)]
    print(f"\ndown with SiLU-and-mul: N={n} K={k} (gate_up [M, {2 * k}]), us per call")
    print(f"{'M':>3} {'silu+cuBLAS':>12} {'silu+GEMV':>10} {'fused':>8} {'fused/best':>11}")
    for m in rows:
        gate_up = torch.randn(m, 2 * k, device=dev, generator=gen, dtype=torch.bfloat16)
        cublas = graph_us(lambda i, g=gate_up: F.linear(silu_and_mul(g), weights[i]), layers)
        gemv = graph_us(lambda i, g=gate_up: dense_gemv(silu_and_mul(g), weights[i]), layers)
        fused = graph_us(lambda i, g=gate_up: silu_mul_gemv(g, weights[i]), layers)
        print(f"{m:>3} {cublas:>12.1f} {gemv:>10.1f} {fused:>8.1f} "
              f"{fused / min(cublas, gemv):>11.2f}")
    weights.clear()
    torch.cuda.empty_cache()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS),
                   help=f"comma-separated presets (default {','.join(MODELS)})")
    p.add_argument("--rows", default=",".join(map(str, ROWS)),
                   help="row counts (tokens), each 1..16")
    p.add_argument("--sweep", action="store_true",
                   help="also time other GEMV launches per shape and row count")
    args = p.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    if not all(1 <= r <= 16 for r in rows):
        p.error(f"--rows: each row count must be 1..16, got {args.rows}")
    if not torch.cuda.is_available():
        sys.exit("dense-gemv needs a CUDA device")
    from warmgate.server.devtools.gpu_card import detect

    card = detect("cuda")
    print(card.describe())
    gen = torch.Generator(device="cuda").manual_seed(0)
    for model in args.models.split(","):
        projections, num_layers = projection_shapes(model)
        print(f"\n== {model}: {num_layers} layers")
        per_shape = {name: bench_shape(name, n, k, rows, card.bytes_per_s, args.sweep, gen)
                     for name, (n, k) in projections.items()}
        bench_fused_down(*projections["down"], rows, gen)
        print(f"\n{model}: a decode step's dense GEMMs (the layers' four projections x "
              f"{num_layers}, the head), us")
        print(f"{'M':>3} {'cuBLAS':>9} {'GEMV':>9} {'faster':>9} {'faster/cuBLAS':>14}")
        for m in rows:
            times = {name: t[m] for name, t in per_shape.items()}
            weight = {name: (1 if name == "head" else num_layers) for name in times}
            cublas = sum(weight[s] * c for s, (c, _) in times.items())
            gemv = sum(weight[s] * g for s, (_, g) in times.items())
            best = sum(weight[s] * min(c, g) for s, (c, g) in times.items())
            print(f"{m:>3} {cublas:>9.0f} {gemv:>9.0f} {best:>9.0f} {best / cublas:>14.2f}")


if __name__ == "__main__":
    main()
