"""The first call at a size a kernel map skipped: does it cost more than the same call again?

    python bench/warm.py kernel-map-touch --device cuda --model llama-3.2-1b [runner flags]
        [--samples 24] [--policies every,sequences,kept,none] [--json FILE]

A warm start with a kernel map sweeps only some sizes of a shape sweep: what
size_sweeps.sizes_to_keep keeps, the sizes where a kernel launches for the first time and the
largest. The map promises that a first batch at any other size pays nothing a steady one does
not: the kernels it launches are loaded, and nothing else is chosen per size that costs time.
The sampler rows keep that promise. The dense GEMMs (every layer weight over the whole token
budget here, and the head) do not: cuBLAS chooses an algorithm at every new shape, and that is
why warmup now sweeps every token count a forward can run outside a graph, with no map
(warmup/gemm_shapes.py).

It checks the promise directly. One process profiles every size of every sweep once (the
maps' own probe). Then each policy runs in a fresh process of its own (nothing one ran can
help another):

  every      every size (a start without a map)
  sequences  the first size of each distinct kernel sequence, and the largest (the maps of
             format 2, before the current rule)
  kept       what a map keeps now (size_sweeps.sizes_to_keep)
  none       no size at all (what the sweeps are for)
  thread     every size, swept on a thread of its own with a CUDA stream of its own (does a
             sweep run beside other start-up work warm what the runner's thread calls later?)

and after its sweep times, at sizes that neither map kept (drawn per sweep, the same for every
policy), each call synchronized, first and then twice again: first minus the faster repeat is
what a first batch of that size pays for that operation. Per family and policy it prints the
sweep's seconds, the median / p90 / max of that excess over all sampled calls, and the sum over
the family's sweeps of each sweep's median excess (about what one first batch pays when it
issues every sweep's operation once: the GEMMs of all the weights, or each sampler variant).
A kept map keeps its promise when its row matches `every`'s, not `none`'s.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

from warmgate.server.devtools.runner_setup import add_runner_args, build, runner_config
from warmgate.server.warmup.gemm_shapes import gemm_plan, gemm_sweep, layer_weights
from warmgate.server.warmup.sampler_rows import sampler_sweeps
from warmgate.server.warmup.size_sweeps import SizeSweep, profile_sweep, sizes_to_keep

POLICIES = ("every", "sequences", "kept", "none", "thread")
Signatures = list[list[str]]


def first_of_each_sequence(signatures: Signatures) -> list[int]:
    """The format-2 rule: the first size of each distinct kernel sequence, and the largest."""
    first: dict[tuple[str, ...], int] = {}
    for m, signature in enumerate(signatures, start=1):
        first.setdefault(tuple(signature), m)
    return sorted({*first.values(), len(signatures)})


def policy_sizes(policy: str, signatures: Signatures) -> list[int]:
    if policy in ("every", "thread"):
        return list(range(1, len(signatures) + 1))
    if policy == "sequences":
        return first_of_each_sequence(signatures)
    if policy == "kept":
        return sizes_to_keep([tuple(s) for s in signatures])
    return []


def families(runner: Any) -> dict[str, list[SizeSweep]]:
    """Every layer weight over the whole token budget (whatever the graphs would take from
    it), the head over its logits rows, and the sampler rows as the compile phase has them."""
    head, rows = gemm_plan(runner)[-1]
    layers = [gemm_sweep(w, runner.max_num_tokens) for w in layer_weights(runner.model)]
    return {"dense GEMMs": [*layers, gemm_sweep(head, rows[-1])],
            "sampler rows": sampler_sweeps(runner)}


def _timed(call: Any, m: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    call(m)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def run_on_a_thread(todo: list[tuple[SizeSweep, int]]) -> None:
    """The calls on a new thread and a side stream (inference mode is per thread)."""
    def sweep_all() -> None:
        with torch.inference_mode(), torch.cuda.stream(torch.cuda.Stream()):
            for sweep, m in todo:
                sweep.call(m)
            torch.cuda.current_stream().synchronize()

    thread = threading.Thread(target=sweep_all)
    thread.start()
    thread.join()


@torch.inference_mode()
def child(args: argparse.Namespace) -> dict[str, Any]:
    runner, _, _ = build(runner_config(args))
    work = Path(args.work)
    found = families(runner)
    if args.child == "learn":
        return {family: {s.key: [list(sig) for sig in profile_sweep(s)] for s in sweeps}
                for family, sweeps in found.items()}
    plan = json.loads((work / "plan.json").read_text())
    out: dict[str, Any] = {}
    for family, sweeps in found.items():
        start = time.perf_counter()
        todo = [(sweep, m) for sweep in sweeps
                for m in policy_sizes(args.child, plan["signatures"][family][sweep.key])]
        if args.child == "thread":
            run_on_a_thread(todo)
        else:
            for sweep, m in todo:
                sweep.call(m)
        torch.cuda.synchronize()
        swept_s = time.perf_counter() - start
        calls = len(todo)
        excess: dict[str, list[float]] = {}
        for sweep in sweeps:
            for m in plan["test_sizes"][family][sweep.key]:
                first = _timed(sweep.call, m)
                again = min(_timed(sweep.call, m), _timed(sweep.call, m))
                excess.setdefault(sweep.key, []).append(first - again)
        out[family] = {"calls": calls, "swept_s": swept_s, "excess_s": excess}
    return out


def run_child(argv: list[str], policy: str, work: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, *argv, "--child", policy, "--work",
                           str(work)], check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def pick_test_sizes(signatures: dict[str, dict[str, Signatures]], samples: int, seed: int
                    ) -> dict[str, dict[str, list[int]]]:
    """Per sweep, up to `samples` sizes that neither map keeps."""
    rng = random.Random(seed)
    picked: dict[str, dict[str, list[int]]] = {}
    for family, sweeps in signatures.items():
        for key, sigs in sweeps.items():
            kept = {*first_of_each_sequence(sigs), *policy_sizes("kept", sigs)}
            free = [m for m in range(1, len(sigs) + 1) if m not in kept]
            picked.setdefault(family, {})[key] = sorted(rng.sample(free, min(samples,
                                                                             len(free))))
    return picked


def _us(seconds: float) -> str:
    return f"{1e6 * seconds:8.1f}"


def report(plan: dict[str, Any], results: dict[str, dict[str, Any]]) -> None:
    for family, sweeps in plan["signatures"].items():
        total = sum(len(s) for s in sweeps.values())
        print(f"{family}: {len(sweeps)} sweeps, {total} sizes; first-call excess at "
              f"{sum(map(len, plan['test_sizes'][family].values()))} sizes no map kept, us")
        print(f"  {'policy':<10} {'sizes run':>10} {'sweep s':>8} {'median':>8} {'p90':>8} "
              f"{'max':>8} {'sum of sweep medians':>21}")
        for policy, result in results.items():
            row = result[family]
            every = sorted(x for xs in row["excess_s"].values() for x in xs)
            if not every:
                continue
            p90 = every[min(len(every) - 1, int(0.9 * len(every)))]
            summed = sum(statistics.median(xs) for xs in row["excess_s"].values())
            print(f"  {policy:<10} {row['calls']:>10} {row['swept_s']:>8.3f} "
                  f"{_us(statistics.median(every))} {_us(p90)} {_us(every[-1])} "
                  f"{_us(summed):>21}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_runner_args(p)
    p.add_argument("--samples", type=int, default=24, help="sizes timed per sweep")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--json", default=None, help="also write every figure here")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--work", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        print(json.dumps(child(args)))
        return 0
    if not args.device.startswith("cuda") or not torch.cuda.is_available():
        print("kernel_map_touch.py: --device cuda with a GPU is needed (the sweeps and the "
              "kernel maps are CUDA only)", file=sys.stderr)
        return 2
    policies = [x for x in args.policies.split(",") if x]
    unknown = [x for x in policies if x not in POLICIES]
    if unknown:
        print(f"kernel_map_touch.py: --policies: unknown {unknown[0]!r} (one of "
              f"{', '.join(POLICIES)})", file=sys.stderr)
        return 2
    argv = [a for a in sys.argv[1:]]
    with tempfile.TemporaryDirectory(prefix="warmgate-map-touch-") as tmp:
        work = Path(tmp)
        start = time.perf_counter()
        signatures = run_child(argv, "learn", work)
        plan = {"signatures": signatures,
                "test_sizes": pick_test_sizes(signatures, args.samples, args.seed)}
        (work / "plan.json").write_text(json.dumps(plan))
        print(f"profiled every size in {time.perf_counter() - start:.1f} s (a process of its "
              f"own); {args.model}, max_num_batched_tokens {args.max_num_batched_tokens}, "
              f"max_num_seqs {args.max_num_seqs}, k={args.num_speculative_steps}; each policy "
              "in a fresh process")
        for family, sweeps in signatures.items():
            for key, sigs in sweeps.items():
                print(f"  {family} {key}: {len(sigs)} sizes, {len({tuple(s) for s in sigs})} "
                      f"kernel sequences, {len({n for s in sigs for n in s})} kernels; kept "
                      f"{len(policy_sizes('kept', sigs))}, format 2 kept "
                      f"{len(first_of_each_sequence(sigs))}")
        results = {policy: run_child(argv, policy, work) for policy in policies}
    report(plan, results)
    if args.json:
        Path(args.json).write_text(json.dumps({"plan": plan, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
