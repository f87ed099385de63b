"""The batch-invariant matmul (kernels/batch_invariant.py) against cuBLAS on the GPU, per weight
shape of a model and per row count, in CUDA graphs (the way decode runs: no launch overhead).

Each graph calls the GEMM once per "layer", every layer with its own copy of the weight, so the
weight bytes cross HBM as a model's layers would (the copies together are several times the
L2). Columns: cuBLAS; the kernel unsplit (S = 1, what --deterministic ran before the K split);
the plan as the server launches it (matmul_plan: S from N and K, splits as programs of their
own or walked in one program by M, and the row tile by M: an unsplit weight's 128 rows from
128 rows up); the plan's S forced into either way; other S for comparison; an unsplit
weight's plan forced to 64-row tiles (M64) at every M; the plan forced to 128-row tiles (M128)
at every M. Then a checks line per shape: the server's launch against a float32 reference, a
row alone against the same row inside batches of 64, 65 and 130 (130 rows take an unsplit
weight's 128-row tiles, one row its 64-row tile), the two ways of running the splits against
each other, and 128-row tiles and the other column tile against the 64-row plan, bit for bit.

    python bench/lib/invariant_matmul_gpu.py [--model llama-3.2-1b|llama-3.1-8b]
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
import torch.nn.functional as F
from graph_timing import graph_us, projection_shapes

from warmgate.server.kernels.batch_invariant import matmul
from warmgate.server.kernels.matmul_plan import (
    TALL_BLOCK_M,
    TALL_NUM_WARPS,
    MatmulTiles,
    device_sm_count,
    matmul_tiles,
    split_count,
)

MODELS = ("llama-3.2-1b", "llama-3.1-8b")
ROWS = (1, 8, 32, 64, 128, 256, 512, 2048)
MIN_WORKING_SET = 512 << 20
MAX_LAYERS = 64
PARALLEL, ONE_PROGRAM = 1 << 30, 1  # sm_count values that force the splits' way


def time_row(x: torch.Tensor, weights: list[torch.Tensor], layers: int,
             variants: list[tuple[MatmulTiles | None, int | None]]) -> list[float]:
    """Microseconds per call: cuBLAS, then each (tiles, sm_count) variant of the kernel."""
    line = [graph_us(lambda i: F.linear(x, weights[i]), layers)]
    for tiles, sm in variants:
        line.append(graph_us(
            lambda i, t=tiles, s=sm: matmul(x, weights[i], tiles=t, sm_count=s), layers))
    return line


def with_splits(t: MatmulTiles, k: int, splits: int) -> MatmulTiles:
    k_tiles = -(-k // t.block_k)
    per = -(-k_tiles // splits)
    s = -(-k_tiles // per)
    return dataclasses.replace(t, splits=s, k_tiles_per_split=per if s > 1 else 0)


def tall_tiles(plan: MatmulTiles) -> MatmulTiles:
    """The plan with the row tile an unsplit weight's launch takes from TALL_BLOCK_M rows."""
    return dataclasses.replace(plan, block_m=TALL_BLOCK_M, num_warps=TALL_NUM_WARPS)


def other_block_n(plan: MatmulTiles) -> int:
    """The column tile compared with the plan's: 128 beside 64, 64 beside anything else."""
    return 128 if plan.block_n == 64 else 64


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama-3.2-1b", choices=sorted(MODELS))
    p.add_argument("--rows", default=",".join(map(str, ROWS)))
    args = p.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    dev = torch.device("cuda")
    sms = device_sm_count(dev)
    print(f"{torch.cuda.get_device_name(dev)}, {sms} SMs, model {args.model}")
    gen = torch.Generator(device=dev).manual_seed(0)
    totals: dict[tuple[int, str], float] = {}
    for name, (n, k) in projection_shapes(args.model)[0].items():
        layers = max(2, min(MAX_LAYERS, MIN_WORKING_SET // (n * k * 2)))
        weights = [torch.randn(n, k, device=dev, generator=gen, dtype=torch.bfloat16) / k ** 0.5
              for _ in range(layers)]
        plan = matmul_tiles(n, k, sms)
        # "plan": no tiles given, so the launch's row tile follows M as the server's does.
        variants: dict[str, tuple[MatmulTiles | None, int | None]] = {
            "S=1": (with_splits(plan, k, 1), sms), "plan": (None, sms)}
        if plan.splits > 1:
            variants["plan-par"] = (plan, PARALLEL)
            variants["plan-one"] = (plan, ONE_PROGRAM)
            for s in (4, 8, 16):
                alt = with_splits(plan, k, s)
                if alt.splits not in (1, plan.splits):
                    variants[f"S={alt.splits}-par"] = (alt, PARALLEL)
            # The other column tile (a split weight's plan takes 64; 128 was the plan before),
            # its split recounted for its N tiles.
            bn = other_block_n(plan)
            wide = dataclasses.replace(plan, block_n=bn, num_warps=8 if bn == 128 else 4)
            wide = with_splits(wide, k, split_count(-(-n // bn), -(-k // plan.block_k), sms))
            variants[f"N{bn},S={wide.splits}"] = (wide, sms)
        # Given tiles are launched as they are at every M: the 64-row plan (an unsplit weight's
        # plan column takes 128 rows from 128 rows up; a split weight's is this already), and
        # 128-row tiles, whose rows round as the plan's do (the checks say): the tile's MMA
        # steps along K are the same, only more rows share them.
        if plan.splits == 1:
            variants["M64"] = (plan, sms)
        variants["M128"] = (tall_tiles(plan), sms)
        print(f"\n{name}: N={n} K={k}, {layers} layers, plan S={plan.splits} x "
              f"{plan.k_tiles_per_split} K tiles, BLOCK_N={plan.block_n}")
        print(f"{'M':>5} {'cublas':>8} " + " ".join(f"{v:>11}" for v in variants))
        for m in rows:
            x = torch.randn(m, k, device=dev, generator=gen, dtype=torch.bfloat16)
            line = time_row(x, weights, layers, list(variants.values()))
            for col, label in enumerate(("cublas", "S=1", "plan")):
                totals[(m, label)] = totals.get((m, label), 0.0) + line[col]
            print(f"{m:>5} " + f"{line[0]:>8.1f} " + " ".join(f"{v:>11.1f}" for v in line[1:]))
        check(n, k, weights[0], plan, sms, gen)
        del weights
        torch.cuda.empty_cache()
    print("\nper shape once (a layer + the head), us: M, cublas, S=1, plan, plan/cublas")
    for m in rows:
        c, s1, pl = (totals[(m, v)] for v in ("cublas", "S=1", "plan"))
        print(f"{m:>5} {c:>9.1f} {s1:>9.1f} {pl:>9.1f} {pl / c:>6.2f}x")


def check(n: int, k: int, w: torch.Tensor, plan: MatmulTiles, sms: int,
          gen: torch.Generator) -> None:
    x = torch.randn(130, k, device=w.device, generator=gen, dtype=torch.bfloat16)
    served = matmul(x, w, sm_count=sms)  # the server's launch: 130 rows, its row tile
    ref = x.float() @ w.float().T
    err = ((served.float() - ref).norm() / ref.norm()).item()
    alone = torch.cat([matmul(x[r:r + 1], w, sm_count=sms) for r in (0, 63, 64, 129)])
    inv = all(torch.equal(matmul(x[:mm], w, sm_count=sms)[r], alone[i])
              for mm in (64, 65, 130) for i, r in enumerate((0, 63, 64, 129)) if r < mm)
    ways = torch.equal(matmul(x, w, tiles=plan, sm_count=PARALLEL),
                       matmul(x, w, tiles=plan, sm_count=ONE_PROGRAM))
    # Other tile shapes with the same K ranges against the 64-row plan's, forced at 130 rows:
    # the same bits let the row tile follow M without a row rounding differently alone and in
    # a batch (the server's 128 rows of an unsplit weight rely on it).
    out = matmul(x, w, tiles=plan, sm_count=sms)
    bn = other_block_n(plan)
    other_n = dataclasses.replace(plan, block_n=bn, num_warps=8 if bn == 128 else 4)
    same_m = torch.equal(out, matmul(x, w, tiles=tall_tiles(plan), sm_count=sms))
    same_n = torch.equal(out, matmul(x, w, tiles=other_n, sm_count=sms))
    print(f"check N={n} K={k}: rel err {err:.2e}, row alone == in batch: {inv}, "
          f"splits apart == in one program: {ways}, BLOCK_M {TALL_BLOCK_M} == {plan.block_m}: "
          f"{same_m}, BLOCK_N {other_n.block_n} == {plan.block_n}: {same_n}")


if __name__ == "__main__":
    main()
