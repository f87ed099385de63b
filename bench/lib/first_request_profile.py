"""--mode profile: where a step's host time goes, the first batch of a class after ready against
its steady steps, function by function (cProfile), and how much of a steady step the GPU is
busy (torch.profiler).

    python bench/warm.py first-request --mode profile --device cuda \
        --model llama-3.2-1b --attention-backend triton --num-speculative-steps 3

Classes and their steps are --mode batch's (same requests, same idle gap before every timed
step), so a function that costs more in the first batch here is a candidate for that mode's
ratio. cProfile slows Python-heavy code, so read the columns against each other, not against
--mode batch's milliseconds.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import statistics
import time
from collections.abc import Callable

import torch
from first_request_steps import CLASSES, Case, pick_classes

from warmgate.server.devtools.batch_driver import BatchDriver, Work
from warmgate.server.devtools.runner_setup import (
    add_runner_args,
    build,
    configure_logging,
    runner_config,
    warm,
)

# pstats' key for a function: (file, line, name).
FuncKey = tuple[str, int, str]


def label(key: FuncKey) -> str:
    path, line, name = key
    if path == "~":  # a builtin: the name says which
        return name
    return f"{path.rsplit('/', 1)[-1]}:{line}({name})"


class ProfiledCase(Case):
    """The batch mode's Case with every timed step run under its own cProfile."""

    def __init__(self, sched: BatchDriver, title: str, rng: random.Random,
                 gap_s: float) -> None:
        super().__init__(sched, title.replace(" ", "_"), rng, gap_s)
        self.title = title
        # Per timed step: (wall seconds, {function: (calls, own seconds)}).
        self.steps: list[tuple[float, dict[FuncKey, tuple[int, float]]]] = []
        self._own: dict[FuncKey, tuple[int, float]] = {}  # the last run_step's profile

    def timed(self, plan: dict[str, Work]) -> float:
        seconds = super().timed(plan)
        self.steps.append((seconds, self._own))
        return seconds

    def run_step(self, plan: dict[str, Work]) -> None:
        """The step and its sync under the profiler; Case.timed's sleep stays outside."""
        prof = cProfile.Profile()
        prof.enable()
        try:
            super().run_step(plan)
        finally:
            prof.disable()
        stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]  # not in the stubs
        self._own = {key: (int(nc), float(tt)) for key, (_, nc, tt, _, _) in stats.items()}


def compare(case: ProfiledCase, top: int) -> None:
    """The functions whose own time grew most from the steady median to the first step,
    then the steady step's largest."""
    (first_s, first), steady = case.steps[0], case.steps[1:]
    keys = set(first).union(*(own for _, own in steady))

    def median_own(key: FuncKey) -> float:
        return statistics.median(own.get(key, (0, 0.0))[1] for _, own in steady)

    med = {key: median_own(key) for key in keys}
    steady_s = statistics.median(s for s, _ in steady)
    print(f"{case.title}: first {first_s * 1e3:.2f} ms, steady median {steady_s * 1e3:.2f} ms "
          f"(ratio {first_s / steady_s:.2f}; under cProfile)")
    print(f"  {'function':<64} {'calls':>6} {'first ms':>9} {'steady ms':>10} {'diff':>7}")
    grew = sorted(keys, key=lambda k: first.get(k, (0, 0.0))[1] - med[k], reverse=True)
    for key in grew[:top]:
        calls, own = first.get(key, (0, 0.0))
        print(f"  {label(key)[:64]:<64} {calls:>6} {own * 1e3:>9.3f} {med[key] * 1e3:>10.3f} "
              f"{(own - med[key]) * 1e3:>+7.3f}")
    print(f"  steady step's largest own times (median ms over {len(steady)} steps):")
    for key in sorted(keys, key=lambda k: med[k], reverse=True)[:top]:
        print(f"    {label(key)[:64]:<64} {med[key] * 1e3:>8.3f}")


def gpu_busy(sched: BatchDriver, run: Callable[[Case, int], list[float]],
             name: str, rng: random.Random, gap_s: float, repeats: int) -> None:
    """Kernel time and launches per step of the class, under torch.profiler, against the
    steps' wall time: a ratio far below 1 means the step waits on the host."""
    from torch.profiler import ProfilerActivity, profile

    case = Case(sched, "gpu_" + name, rng, gap_s)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        walls = run(case, repeats)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy_s = sum(e.device_time_total for e in kernels) / 1e6  # microseconds
    steps = len(walls)
    print(f"{name}: GPU busy {busy_s / steps * 1e3:.2f} ms and {len(kernels) / steps:.0f} "
          f"kernels per step; wall median {statistics.median(walls) * 1e3:.2f} ms "
          f"(under torch.profiler); busy / wall {busy_s / sum(walls):.2f}")


def main(argv: list[str], prog: str | None = None) -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    add_runner_args(p)
    p.add_argument("--classes", default=None,
                   help="comma-separated batch classes (default: every class this runner's "
                        "--num-speculative-steps serves)")
    p.add_argument("--repeats", type=int, default=10, help="steady steps per class")
    p.add_argument("--gap-s", type=float, default=0.05, help="idle before every timed step")
    p.add_argument("--top", type=int, default=15, help="rows per table")
    args = p.parse_args(argv)
    configure_logging(False)
    k = args.num_speculative_steps
    served = tuple(c for c in CLASSES if c.num_spec == k)
    wanted = pick_classes(args.classes, served,
                          f" (the classes of --num-speculative-steps {k})")
    runner, load_phase, monitor = build(runner_config(args))
    start = time.perf_counter()
    report = warm(runner, load_phase, monitor)
    if not report.succeeded:
        raise SystemExit(f"warmup failed: {report.to_dict()}")
    print(f"warmup {time.perf_counter() - start:.1f} s ({args.model}, {args.device}, "
          f"{args.attention_backend}, k={k}); {args.gap_s:g} s idle before every timed step")
    sched = BatchDriver(runner)
    rng = random.Random(0)
    cases = []
    for cls in wanted:
        case = ProfiledCase(sched, cls.name, rng, args.gap_s)
        cls.run(case, args.repeats)
        cases.append(case)
    for case in cases:
        compare(case, args.top)
    if runner.device.type == "cuda":
        for cls in wanted:
            gpu_busy(sched, cls.run, cls.name, rng, args.gap_s, args.repeats)
    monitor.close()
    return 0

