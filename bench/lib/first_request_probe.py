"""--mode probe and --mode touch: why a first step after ready can be slower than the next.

probe: is a first batch slow because it is first, or because of what ran (or idled) before
it? Times prefill / decode steps in sequences with idle gaps and other work between, with
thread CPU time, GC pauses and new CUDA segments per step; --trace-segments instead lists the
allocations of the first steps that needed new CUDA segments (cudaMalloc).

touch (GPU): where a first batch of a new shape spends its extra time after warmup:
1. a dense GEMM at a token count warmup never ran, first call vs second (cuBLAS chooses an
   algorithm per new problem shape);
2. a first prefill / decode batch vs the same batch again, under torch.profiler: device
   kernel time vs host time, and the host ops whose self time grew;
3. the same first-batch ratio after the warmup's GEMM sweep (warmup.gemm_shapes) ran. (The
   run in bench/results/h200-first-touch.txt predates that module: it swept its own list,
   the vocabulary head up to max_num_batched_tokens rows.)

    python bench/warm.py first-request --mode touch --device cuda --model llama-3.2-1b \\
        --attention-backend triton --max-num-seqs 16 --max-num-batched-tokens 1024
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from first_request_steps import (
    PROMPT_LEN,
    Case,
    decode,
    decode_plan,
    decode_set,
    prefill_requests,
)
from torch.profiler import ProfilerActivity, profile

from warmgate.server.devtools.batch_driver import BatchDriver, DrivenRequest, Work
from warmgate.server.devtools.runner_setup import (
    add_runner_args,
    build,
    build_and_warm,
    configure_logging,
    runner_config,
    warm,
)
from warmgate.server.runner.scheduler_output import SamplingParams
from warmgate.server.warmup.gemm_shapes import gemm_plan, layer_weights, sweep_gemm_shapes

GC_PAUSES: list[tuple[int, float]] = []
_gc_start: list[float] = []
StepTimes = tuple[float, float, int, int]  # wall s, thread CPU s, GC pauses, new segments


def _gc_cb(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _gc_start.append(time.perf_counter())
    elif _gc_start:
        GC_PAUSES.append((info["generation"], time.perf_counter() - _gc_start.pop()))


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def segments() -> int:
    if not torch.cuda.is_available():
        return 0
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0))


def timed(sched: BatchDriver, plan: dict[str, Work]) -> StepTimes:
    _sync()
    GC_PAUSES.clear()
    seg = segments()
    c0, w0 = time.thread_time(), time.perf_counter()
    sched.step(plan)
    _sync()
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


def show(label: str, r: StepTimes, steady: float | None = None) -> None:
    ratio = f" ratio {r[0] / steady:.2f}" if steady else ""
    print(f"  {label:<34} wall {r[0] * 1e3:7.2f} ms  cpu {r[1] * 1e3:7.2f} ms  gc {r[2]}  "
          f"new segments {r[3]}{ratio}", flush=True)


# The prefill the probe times: (requests, tokens each); --prefill-shape sets it.
PREFILL_SHAPE = [4, 24]


def prefill_once(case: Case, num_tokens: int | None = None) -> StepTimes:
    reqs, plan = prefill_requests(case, num_tokens or PREFILL_SHAPE[1], PREFILL_SHAPE[0])
    r = timed(case.sched, plan)
    case.finish(reqs)
    return r


def decode_once(case: Case, reqs: list[DrivenRequest], k: int) -> StepTimes:
    return timed(case.sched, decode_plan(case, reqs, k))


def probe_decode(case: Case, k: int) -> None:
    reqs = decode_set(case)
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
    case.finish(reqs)
    for _ in range(3):
        prefill_once(case)
    reqs = decode_set(case)
    show("after 3 prefills", decode_once(case, reqs, k), med)


def probe_prefill(case: Case, k: int) -> None:
    first = prefill_once(case)
    steady = [prefill_once(case) for _ in range(15)]
    med = statistics.median(s[0] for s in steady)
    print(f"prefill {PREFILL_SHAPE[0]}x{PREFILL_SHAPE[1]}")
    show("first", first, med)
    show("second", steady[0], med)
    show("steady median", (med, statistics.median(s[1] for s in steady), 0, 0), med)
    show("steady max", max(steady), med)
    for gap in (0.01, 0.1, 1.0, 3.0):
        time.sleep(gap)
        show(f"after {gap} s idle", prefill_once(case), med)
    show("again", prefill_once(case), med)
    reqs = decode_set(case)
    for _ in range(30):
        decode_once(case, reqs, k)
    case.finish(reqs)
    show("after 30 decodes", prefill_once(case), med)
    gc.collect()
    show("after gc.collect", prefill_once(case), med)
    x = torch.randn(4096, 4096, device=case.sched.runner.device)
    for _ in range(200):
        x @ x
    show("after 200 big GEMMs", prefill_once(case), med)


def probe(argv: list[str], prog: str | None = None) -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[1])
    add_runner_args(p)
    p.add_argument("--first", default="prefill", choices=("prefill", "decode"))
    p.add_argument("--prefill-shape", default="4x24", metavar="RxN",
                   help="the timed prefill: R requests of N prompt tokens each")
    p.add_argument("--trace-segments", action="store_true",
                   help="instead of timing: which allocations of the first step (and of "
                        "the second) needed new CUDA segments")
    args = p.parse_args(argv)
    if args.trace_segments and not args.device.startswith("cuda"):
        p.error("--trace-segments reads the CUDA caching allocator: pass --device cuda")
    PREFILL_SHAPE[:] = [int(v) for v in args.prefill_shape.lower().split("x")]
    gc.callbacks.append(_gc_cb)
    k = args.num_speculative_steps
    runner, load_phase, monitor = build(runner_config(args))
    t = time.perf_counter()
    warm(runner, load_phase, monitor)
    print(f"k={k} warm {time.perf_counter() - t:.1f} s; threads "
          f"{[th.name for th in threading.enumerate()]}; gc counts {gc.get_count()}")
    case = Case(BatchDriver(runner), "p", random.Random(0))
    if args.trace_segments:
        if args.first == "decode":
            reqs = decode_set(case)
            run_step: Callable[[], object] = lambda: decode_once(case, reqs, k)  # noqa: E731
        else:
            run_step = lambda: prefill_once(case)  # noqa: E731
        for label in ("first", "second", "third"):
            print(f"{args.first} k={k}, {label} step:")
            trace_new_segments(run_step)
        return 0
    (probe_decode if args.first == "decode" else probe_prefill)(case, k)
    return 0


# -- touch --------------------------------------------------------------------------------

def _ms(fn: Callable[[], object]) -> float:
    _sync()
    start = time.perf_counter()
    fn()
    _sync()
    return 1e3 * (time.perf_counter() - start)


def gemm_first_touch(runner: Any, token_counts: list[int]) -> None:
    """The weights the warmup's GEMM sweep runs (one per distinct projection shape, and the
    vocabulary head), each at token counts the warmup never ran: first call vs second."""
    every = [*layer_weights(runner.model), *(w for w, _ in gemm_plan(runner))]
    weights = list({id(w): w for w in every}.values())
    hidden = runner.config.model.hidden_size
    print(f"1. dense GEMMs at new token counts ({len(weights)} weight shapes)")
    for m in token_counts:
        firsts, seconds = [], []
        for w in weights:
            if w.shape[1] != hidden and w.shape[0] != hidden:
                continue
            x = torch.randn(m, w.shape[1], device=w.device, dtype=w.dtype)
            firsts.append(_ms(lambda: F.linear(x, w)))  # noqa: B023 - called at once
            seconds.append(_ms(lambda: F.linear(x, w)))  # noqa: B023
        print(f"   M={m:5d}: first {sum(firsts):7.3f} ms, second {sum(seconds):7.3f} ms over "
              f"{len(firsts)} GEMMs")


def profiled(fn: Callable[[], float]) -> tuple[float, float, list[tuple[str, float]]]:
    """(wall ms, device kernel ms, top host ops by self CPU ms)."""
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        wall = fn()
    events = prof.key_averages()
    device_ms = sum(e.self_device_time_total for e in events) / 1e3
    host = sorted(((e.key, e.self_cpu_time_total / 1e3) for e in events),
                  key=lambda kv: -kv[1])[:12]
    return wall, device_ms, host


def prefill_ms(case: Case, num_tokens: int) -> float:
    return 1e3 * prefill_once(case, num_tokens)[0]


def compare(name: str, run_one: Callable[[], float], repeats: int) -> None:
    first = profiled(run_one)
    for _ in range(2):
        run_one()
    steady = profiled(run_one)
    med = statistics.median([run_one() for _ in range(repeats)])
    print(f"   {name}: first {first[0]:.2f} ms (device {first[1]:.2f}), steady median "
          f"{med:.2f} ms (profiled {steady[0]:.2f}, device {steady[1]:.2f}); ratio "
          f"{first[0] / med:.2f} (under the profiler's overhead)")
    base = dict(steady[2])
    rows = sorted(((k, v, base.get(k, 0.0)) for k, v in first[2]),
                  key=lambda r: -(r[1] - r[2]))[:8]
    for key, v, b in rows:
        print(f"      {key[:60]:<60} self cpu first {v:8.3f} ms  steady {b:8.3f} ms")


def touch(argv: list[str], prog: str | None = None) -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[2])
    add_runner_args(p)
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args(argv)
    configure_logging(False)
    runner, _, monitor = build_and_warm(runner_config(args))
    gemm_first_touch(runner, [96, 77, 300, 96])
    sched = BatchDriver(runner)
    rng = random.Random(0)
    print("2. first batch vs the same batch again, profiled")
    compare("prefill 4x24", lambda: prefill_ms(Case(sched, "p", rng), 24), args.repeats)
    dec = decode(SamplingParams(temperature=0.8, top_p=0.9), 0)
    times = dec(Case(sched, "d", rng), args.repeats)
    print(f"   decode k=0 (4 reqs, graph): first {1e3 * times[0]:.2f} ms, steady median "
          f"{1e3 * statistics.median(times[1:]):.2f} ms, ratio "
          f"{times[0] / statistics.median(times[1:]):.2f}")
    times = dec(Case(sched, "d2", rng), args.repeats)
    print(f"   decode k=0 again, new requests: first {1e3 * times[0]:.2f} ms, ratio "
          f"{times[0] / statistics.median(times[1:]):.2f}")
    start = time.perf_counter()
    sweep_gemm_shapes(runner)  # what the compile phase's --shape-sweeps runs
    _sync()
    print(f"3. ran the warmup's GEMM sweep (the token counts a forward can run outside a "
          f"graph, the head up to the logits rows) in {time.perf_counter() - start:.2f} s; a "
          "new prefill shape now:")
    compare("prefill 4x31", lambda: prefill_ms(Case(sched, "q", rng), 31), args.repeats)
    print(f"   (prompt length of the decode set-up: {PROMPT_LEN})")
    monitor.close()
    return 0
