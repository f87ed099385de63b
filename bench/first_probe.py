"""Diagnostic: is a first batch after ready slow because it is first, or because of what ran
(or idled) before it? Times prefill / decode steps in sequences with idle gaps and other work
between, with thread CPU time, GC pauses and new CUDA segments per step."""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable

import torch

from bench.coverage_scheduler import CoverageScheduler, Work
from bench.first_batch import NUM_REQS, PROMPT_LEN, Case
from bench.inprocess import add_runner_args, build, runner_config, warm
from warmgate.server.warmup.kernels import STOCHASTIC

GC_PAUSES: list[tuple[int, float]] = []
_gc_start: list[float] = []


def _gc_cb(phase: str, info: dict) -> None:
    if phase == "start":
        _gc_start.append(time.perf_counter())
    elif _gc_start:
        GC_PAUSES.append((info["generation"], time.perf_counter() - _gc_start.pop()))


def segments() -> int:
    if not torch.cuda.is_available():
        return 0
    return torch.cuda.memory_stats().get("segment.all.allocated", 0)


def timed(sched: CoverageScheduler, plan: dict) -> tuple[float, float, int, int]:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    GC_PAUSES.clear()
    seg = segments()
    c0, w0 = time.thread_time(), time.perf_counter()
    sched.step(plan)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    w, c = time.perf_counter() - w0, time.thread_time() - c0
    return w, c, len(GC_PAUSES), segments() - seg


def trace_new_segments(step: Callable[[], object]) -> None:
    """Run step() with the allocator's history on; print the segments it had to cudaMalloc
    and, for each block in them, the Python frames (ours) that allocated it."""
    before = {seg["address"] for seg in torch.cuda.memory_snapshot()}
    torch.cuda.memory._record_memory_history(max_entries=200000)
    step()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    for seg in snap["segments"]:
        if seg["address"] in before:
            continue
        print(f"  new segment {seg['total_size'] / 2**20:.2f} MiB ({seg.get('segment_type')}, "
              f"stream {seg.get('stream')})")
        for block in seg["blocks"]:
            ours = [f"{f['filename'].rsplit('/', 2)[-1]}:{f['line']}({f['name']})"
                    for f in block.get("frames", ())
                    if "warmgate" in f["filename"] or "bench" in f["filename"]]
            print(f"    block {block['size'] / 2**20:8.3f} MiB {block['state']:<16} "
                  f"{' < '.join(ours[:4])}")


def show(label: str, r: tuple[float, float, int, int], steady: float | None = None) -> None:
    ratio = f" ratio {r[0] / steady:.2f}" if steady else ""
    print(f"  {label:<34} wall {r[0] * 1e3:7.2f} ms  cpu {r[1] * 1e3:7.2f} ms  gc {r[2]}  "
          f"new segments {r[3]}{ratio}", flush=True)


def prefill_once(case: Case) -> tuple[float, float, int, int]:
    reqs = [case.request(24, STOCHASTIC) for _ in range(NUM_REQS)]
    r = timed(case.sched, {q.req_id: Work(24) for q in reqs})
    for q in reqs:
        case.sched.finish(q.req_id)
    return r


def decode_set(case: Case, k: int) -> list:
    reqs = [case.request(PROMPT_LEN, STOCHASTIC) for _ in range(NUM_REQS)]
    case.sched.step({q.req_id: Work(PROMPT_LEN - 1) for q in reqs})
    return reqs


def decode_once(case: Case, reqs: list, k: int) -> tuple[float, float, int, int]:
    return timed(case.sched, {q.req_id: Work(1 + k, case.drafts(k)) for q in reqs})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_runner_args(p)
    p.add_argument("--first", default="prefill", choices=("prefill", "decode"))
    p.add_argument("--trace-segments", action="store_true",
                   help="instead of timing: which allocations of the first step (and of "
                        "the second) needed new CUDA segments")
    args = p.parse_args(argv)
    if args.trace_segments and not args.device.startswith("cuda"):
        p.error("--trace-segments reads the CUDA caching allocator: pass --device cuda")
    gc.callbacks.append(_gc_cb)
    k = args.num_speculative_steps
    runner, load_phase, monitor = build(runner_config(args))
    t = time.perf_counter()
    warm(runner, load_phase, monitor)
    print(f"k={k} warm {time.perf_counter() - t:.1f} s; threads "
          f"{[th.name for th in threading.enumerate()]}; gc counts {gc.get_count()}")
    sched = CoverageScheduler(runner)
    case = Case(sched, "p", random.Random(0))
    if args.trace_segments:
        if args.first == "decode":
            reqs = decode_set(case, k)
            run_step: Callable[[], object] = lambda: decode_once(case, reqs, k)  # noqa: E731
        else:
            run_step = lambda: prefill_once(case)  # noqa: E731
        for label in ("first", "second", "third"):
            print(f"{args.first} k={k}, {label} step:")
            trace_new_segments(run_step)
        return 0
    if args.first == "decode":
        reqs = decode_set(case, k)
        first = decode_once(case, reqs, k)
        steady = [decode_once(case, reqs, k) for _ in range(15)]
        med = statistics.median(s[0] for s in steady)
        print(f"decode k={k} (set-up prefill untimed before the first)")
        show("first", first, med)
        show("steady median", (med, statistics.median(s[1] for s in steady), 0, 0), med)
        show("steady max", max(steady), med)
        for gap in (0.01, 0.1, 1.0, 3.0):
            time.sleep(gap)
            show(f"after {gap} s idle", decode_once(case, reqs, k), med)
        show("again", decode_once(case, reqs, k), med)
        for q in reqs:
            sched.finish(q.req_id)
        for _ in range(3):
            prefill_once(case)
        reqs = decode_set(case, k)
        show("after 3 prefills", decode_once(case, reqs, k), med)
        return 0
    first = prefill_once(case)
    steady = [prefill_once(case) for _ in range(15)]
    med = statistics.median(s[0] for s in steady)
    print("prefill 4x24")
    show("first", first, med)
    show("second", steady[0], med)
    show("steady median", (med, statistics.median(s[1] for s in steady), 0, 0), med)
    show("steady max", max(steady), med)
    for gap in (0.01, 0.1, 1.0, 3.0):
        time.sleep(gap)
        show(f"after {gap} s idle", prefill_once(case), med)
    show("again", prefill_once(case), med)
    reqs = decode_set(case, k)
    for _ in range(30):
        decode_once(case, reqs, k)
    for q in reqs:
        sched.finish(q.req_id)
    show("after 30 decodes", prefill_once(case), med)
    gc.collect()
    show("after gc.collect", prefill_once(case), med)
    x = torch.randn(4096, 4096, device=runner.device)
    for _ in range(200):
        x @ x
    show("after 200 big GEMMs", prefill_once(case), med)
    return 0


if __name__ == "__main__":
    sys.exit(main())
