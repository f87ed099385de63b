"""The sampler's draw (runner/sampling/warpers.py choose_tokens) on the GPU, three ways side by
side per count of sampled rows, over a llama-3 vocabulary (128,256) of bf16 logits:

- default: the batched torch path (no --deterministic);
- per-row: --deterministic before the per-row kernels, every drawn row alone (torch's
  softmax, sort and cumsum on [1, V], a dozen launches a row, serial on the host);
- invariant: --deterministic now, the rows drawn in one batch with the warpers' softmax and
  cumsum on kernels/row_reductions.py (one program per row, order fixed by the row length)
  and top-k ties in index order (sampling/warper_ops.py canonical_top).

Milliseconds per call (wall clock, host included: the per-row path is host bound; the
sampler is not in a CUDA graph), and each way's ratio to the default. Two parameter mixes:
`topk` (every row has a top_k: torch.topk over the vocabulary) and `mixed` (some rows only
top_p: the full sort). Then the checks, for the invariant path: every seeded row's
probabilities and token the same bits alone as inside the batch, and its tokens against the
per-row path's (the same distribution; a bf16 tie or an ulp apart may rarely pick another).
Then the two kernels alone against torch's softmax and cumsum.

    python bench/lib/sampler_gpu.py [--rows 1,8,64,128] [--vocab 128256] [--reps 20]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from functools import partial

import torch

from warmgate.server.runner.sampling.seeded import make_generator
from warmgate.server.runner.sampling.warper_ops import (
    TORCH_WARPER_OPS,
    WarperOps,
    invariant_warper_ops,
)
from warmgate.server.runner.sampling.warpers import choose_tokens, probabilities
from warmgate.server.runner.scheduler_output import SamplingParams

ROWS = (1, 8, 64, 128)
LLAMA3_VOCAB = 128256
MIXES = {
    "topk": (SamplingParams(temperature=0.8, top_k=50, top_p=0.95),
             SamplingParams(temperature=1.0, top_k=40),
             SamplingParams(temperature=0.6, top_k=20, top_p=0.8, min_p=0.05),
             SamplingParams(temperature=0.7, top_k=100, top_p=0.9)),
    "mixed": (SamplingParams(temperature=0.8, top_k=50, top_p=0.95),
              SamplingParams(temperature=0.7, top_p=0.9),
              SamplingParams(temperature=1.0, top_k=40),
              SamplingParams(temperature=0.6, top_k=20, top_p=0.8, min_p=0.05)),
}
Ways = dict[str, tuple[bool, WarperOps]]  # name -> (row_wise, the warpers' ops)


def seeded_params(mix: str, n: int) -> list[SamplingParams]:
    base = MIXES[mix]
    return [dataclasses.replace(base[i % len(base)], seed=1000 + i)
            for i in range(n)]


def generators(params: list[SamplingParams], dev: torch.device) -> list[torch.Generator | None]:
    return [make_generator(p.seed, 0, dev) if p.seed is not None else None for p in params]


def ms_per_call(fn: Callable[[], object], reps: int) -> float:
    fn()  # kernels loaded, Triton compiled
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3 / reps


def time_ways(ways: Ways, rows: list[int], vocab: int, mix: str, reps: int,
              dev: torch.device) -> None:
    print(f"\nmix {mix}: ms per choose_tokens call (ratio to default)")
    print(f"{'rows':>5} " + " ".join(f"{w:>20}" for w in ways))
    for n in rows:
        x = (torch.randn(n, vocab, device=dev) * 3).bfloat16()  # the model's logits
        params = seeded_params(mix, n)
        gens = generators(params, dev)
        line = [ms_per_call(partial(choose_tokens, x, params, gens, rw, ops), reps)
                for rw, ops in ways.values()]
        print(f"{n:>5} " + " ".join(f"{t:>11.3f} ({t / line[0]:>5.2f}x)" for t in line))


def check_invariant(invariant: WarperOps, rows: list[int], vocab: int, mix: str,
                    dev: torch.device) -> None:
    """Per batch size: seeded rows whose probabilities / token differ alone vs in the batch
    (must be 0), and tokens that differ from the per-row torch path's (info)."""
    for n in rows:
        x = (torch.randn(n, vocab, device=dev) * 3).bfloat16()
        params = seeded_params(mix, n)
        probs = probabilities(x.float(), params, invariant)
        batched = choose_tokens(x, params, generators(params, dev), True, invariant)
        per_row = choose_tokens(x, params, generators(params, dev), True, TORCH_WARPER_OPS)
        prob_diff = tok_diff = 0
        for i, p in enumerate(params):
            alone_x = x[i:i + 1].clone()
            prob_diff += not torch.equal(probabilities(alone_x.float(), [p], invariant)[0],
                                         probs[i])
            alone = choose_tokens(alone_x, [p], generators([p], dev), True, invariant)
            tok_diff += int(alone[0]) != int(batched[i])
        vs_per_row = int((batched != per_row).sum())
        ok = "OK" if prob_diff == tok_diff == 0 else "DIFFERS"
        print(f"check {mix} rows={n}: alone vs batch probabilities differ in {prob_diff}, "
              f"tokens in {tok_diff} rows ({ok}); tokens != per-row path: {vs_per_row}/{n}")


def time_kernels(invariant: WarperOps, rows: list[int], vocab: int, reps: int,
                 dev: torch.device) -> None:
    print("\nkernels alone, us per call: rows, softmax [n, V] torch / per-row kernel, "
          "cumsum [n, 64] torch / per-row kernel")
    for n in rows:
        x = torch.randn(n, vocab, device=dev) * 3
        p = torch.softmax(x[:, :64], dim=-1)
        line = [ms_per_call(partial(torch.softmax, x, dim=-1), reps),
                ms_per_call(partial(invariant.softmax, x), reps),
                ms_per_call(partial(torch.cumsum, p, dim=-1), reps),
                ms_per_call(partial(invariant.cumsum, p), reps)]
        print(f"{n:>5} " + " ".join(f"{t * 1e3:>9.1f}" for t in line))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default=",".join(map(str, ROWS)))
    ap.add_argument("--vocab", type=int, default=LLAMA3_VOCAB)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("sampler_gpu: skipped, it times the sampler on a CUDA device and none is "
              "available", file=sys.stderr)
        return 2
    from warmgate.server.kernels.row_reductions import row_cumsum, row_softmax

    dev = torch.device("cuda")
    rows = [int(r) for r in args.rows.split(",")]
    invariant = invariant_warper_ops(row_softmax, row_cumsum, name="triton-per-row")
    ways: Ways = {"default": (False, TORCH_WARPER_OPS), "per-row": (True, TORCH_WARPER_OPS),
                  "invariant": (True, invariant)}
    print(f"{torch.cuda.get_device_name(dev)}, vocab {args.vocab}, bf16 logits, "
          f"{args.reps} calls per figure")
    with torch.inference_mode():
        for mix in MIXES:
            time_ways(ways, rows, args.vocab, mix, args.reps, dev)
        print()
        for mix in MIXES:
            check_invariant(invariant, rows, args.vocab, mix, dev)
        time_kernels(invariant, rows, args.vocab, args.reps, dev)
    return 0


if __name__ == "__main__":
    sys.exit(main())
