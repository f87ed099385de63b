"""Where a first batch of a new shape spends its extra time after warmup (GPU diagnostic).

    PYTHONPATH=client:server:. python bench/first_touch.py --device cuda --model llama-3.2-1b \
        --attention-backend triton --max-num-seqs 16 --max-num-batched-tokens 1024

Nothing compiles after ready (bench/coverage.py), yet bench/first_batch.py measured first
prefill and decode batches 12-39 % over their steady median. This separates the suspects:
1. a dense GEMM at a token count warmup never ran, first call vs second (cuBLAS chooses an
   algorithm per new problem shape);
2. a first prefill / decode batch vs the same batch again, under torch.profiler: device
   kernel time vs host time, and the host ops whose self time grew;
3. the same first-batch ratio after the warmup's GEMM sweep (warmup.gemm_shapes) ran. (The
   run in bench/results/h200-first-touch.txt predates that module: it swept its own list,
   the vocabulary head up to max_num_batched_tokens rows.)
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from bench.coverage_scheduler import CoverageScheduler
from bench.first_batch import NUM_REQS, PROMPT_LEN, Case, decode
from bench.inprocess import add_runner_args, build, configure_logging, runner_config, warm
from warmgate.server.runner.scheduler_output import SamplingParams
from warmgate.server.warmup.gemm_shapes import gemm_plan, sweep_gemm_shapes
from warmgate.server.warmup.kernels import STOCHASTIC


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _ms(fn: Callable[[], object]) -> float:
    _sync()
    start = time.perf_counter()
    fn()
    _sync()
    return 1e3 * (time.perf_counter() - start)


def dense_weights(runner: object) -> list[torch.Tensor]:
    """The weights the warmup's GEMM sweep runs: one per distinct projection shape, and the
    vocabulary head."""
    return [w for w, _ in gemm_plan(runner)]


def gemm_first_touch(runner: object, token_counts: list[int]) -> None:
    weights = dense_weights(runner)
    hidden = runner.config.model.hidden_size  # type: ignore[attr-defined]
    print(f"1. dense GEMMs at new token counts ({len(weights)} weight shapes)")
    for m in token_counts:
        firsts, seconds = [], []
        for w in weights:
            if w.shape[1] != hidden and w.shape[0] != hidden:
                continue
            k = w.shape[1]
            x = torch.randn(m, k, device=w.device, dtype=w.dtype)
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


def prefill_once(case: Case, num_tokens: int) -> float:
    reqs = [case.request(num_tokens, STOCHASTIC) for _ in range(NUM_REQS)]
    from bench.coverage_scheduler import Work

    ms = _ms(lambda: case.sched.step({r.req_id: Work(num_tokens) for r in reqs}))
    for r in reqs:
        case.sched.finish(r.req_id)
    return ms


def compare(name: str, run_one: Callable[[], float], repeats: int) -> None:
    first = profiled(run_one)
    for _ in range(2):
        run_one()
    steady = profiled(run_one)
    rest = [run_one() for _ in range(repeats)]
    med = statistics.median(rest)
    print(f"   {name}: first {first[0]:.2f} ms (device {first[1]:.2f}), steady median "
          f"{med:.2f} ms (profiled {steady[0]:.2f}, device {steady[1]:.2f}); ratio "
          f"{first[0] / med:.2f} (under the profiler's overhead)")
    grown = {k: v for k, v in first[2]}
    base = dict(steady[2])
    rows = sorted(((k, v, base.get(k, 0.0)) for k, v in grown.items()),
                  key=lambda r: -(r[1] - r[2]))[:8]
    for key, v, b in rows:
        print(f"      {key[:60]:<60} self cpu first {v:8.3f} ms  steady {b:8.3f} ms")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_runner_args(p)
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args(argv)
    configure_logging(False)
    runner, load_phase, monitor = build(runner_config(args))
    report = warm(runner, load_phase, monitor)
    if not report.succeeded:
        raise SystemExit(f"warmup failed: {report.to_dict()}")
    gemm_first_touch(runner, [96, 77, 300, 96])
    sched = CoverageScheduler(runner)
    rng = random.Random(0)
    print("2. first batch vs the same batch again, profiled")
    compare("prefill 4x24", lambda: prefill_once(Case(sched, "p", rng), 24), args.repeats)
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
    print(f"3. ran the warmup's GEMM sweep (M=1..{args.max_num_batched_tokens}, the head up "
          f"to the logits rows) in {time.perf_counter() - start:.2f} s; a new prefill shape "
          "now:")
    compare("prefill 4x31", lambda: prefill_once(Case(sched, "q", rng), 31), args.repeats)
    print(f"   (prompt length of the decode set-up: {PROMPT_LEN})")
    monitor.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
