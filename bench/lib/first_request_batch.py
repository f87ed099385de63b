"""--mode batch: first-batch latency after ready, per batch class, divided by that class's
steady-state median: with the warmup plan run before ready, and with it disabled.

    python bench/warm.py first-request --mode batch --compile

A ratio near 1 means the first request of that shape costs what every later one does; the
"warmup off" column shows what a request pays when the plan did not run (torch.compile
buckets, Triton/FlashInfer JIT and first-use costs land on it). Every runner (warmup off and
on, per speculative length) is measured in a fresh process with torch.compile's and Triton's
caches pointed at a fresh directory, as on a new pod: nothing one runner ran (kernels loaded,
cuBLAS algorithm choices, graph uploads) helps another. Within a runner, classes run in the
order listed, so a later class can find what an earlier one touched, as in a server.

Every timed step (the first included) follows the same idle gap (--gap-s), as requests do in
a server: a host-bound step right after a pause or after other work runs slower than the same
step back to back (cold CPU caches and clocks; --mode probe measures it), so comparing
a first batch that follows the warmup's other work with a steady median taken back to back
would charge that to the first batch. The back-to-back median is printed beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from first_request_steps import CLASSES, Case, pick_classes

from warmgate.server.devtools.batch_driver import BatchDriver
from warmgate.server.devtools.runner_setup import (
    add_runner_args,
    build,
    configure_logging,
    runner_config,
    warm,
)

Timings = tuple[float, float, float]  # first s, steady median s, back-to-back median s


def measure(args: argparse.Namespace, warmup: bool, num_spec: int
            ) -> tuple[dict[str, Timings], float]:
    """{class: timings} for one runner, and its warmup plan's seconds."""
    results: dict[str, Timings] = {}
    warm_s = 0.0
    runner, load_phase, monitor = build(runner_config(args, num_speculative_steps=num_spec))
    if warmup:
        report = warm(runner, load_phase, monitor)
        if not report.succeeded:
            raise SystemExit(f"warmup failed: {report.to_dict()}")
        warm_s = report.total_duration_s
    sched = BatchDriver(runner)
    rng = random.Random(args.seed)
    classes = [c for c in pick_classes(args.classes) if c.num_spec == num_spec]
    gapped = {c.name: c.run(Case(sched, c.name.replace(" ", "_"), rng, args.gap_s),
                            args.repeats) for c in classes}
    # Then every class again without gaps (all of it steady by now), for the other median.
    for cls in classes:
        again = cls.run(Case(sched, "b2b_" + cls.name.replace(" ", "_"), rng), args.repeats)
        times = gapped[cls.name]
        results[cls.name] = (times[0], statistics.median(times[1:]),
                             statistics.median(again[1:]))
    monitor.close()
    return results, warm_s


def measure_in_subprocess(argv: list[str], warmup: bool, num_spec: int
                          ) -> tuple[dict[str, Timings], float]:
    """measure() in a fresh interpreter: nothing another runner of this benchmark ran (cuBLAS
    algorithm choices, loaded kernels, graph uploads) can make this one's first batch look
    cheaper than on a new pod."""
    one = f"{'on' if warmup else 'off'}:{num_spec}"
    entry = str(Path(__file__).with_name("first_request.py"))
    proc = subprocess.run([sys.executable, entry, "--mode", "batch", *argv, "--one", one],
                          check=True, capture_output=True, text=True)
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    return {k: (v[0], v[1], v[2]) for k, v in data["results"].items()}, data["warm_s"]


def _parser(prog: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    add_runner_args(p)
    p.add_argument("--repeats", type=int, default=15, help="steady-state steps per class")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gap-s", type=float, default=0.1,
                   help="idle seconds before every timed step, the first included (0: back "
                        "to back, as before)")
    p.add_argument("--trials", type=int, default=3,
                   help="fresh processes per (warmup on/off, k): a first batch is one sample "
                        "per process, so the table shows the median (and range) over these")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default 1 on the CPU: steadier timings on a busy "
                        "machine)")
    p.add_argument("--classes", default=None,
                   help="comma-separated classes to run (default all): " +
                        ", ".join(c.name for c in CLASSES))
    p.add_argument("--skip-off", action="store_true",
                   help="only the warmup-on runners (the off column is left empty)")
    p.add_argument("--keep-caches", action="store_true",
                   help="use the usual compile caches instead of a fresh directory")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--one", default=None, metavar="on|off:K", help=argparse.SUPPRESS)
    return p


def main(argv: list[str], prog: str | None = None) -> int:
    args = _parser(prog).parse_args(argv)
    configure_logging(args.verbose)
    if not args.keep_caches:
        fresh = tempfile.mkdtemp(prefix="warmgate-first-batch-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(fresh, "inductor")
        os.environ["TRITON_CACHE_DIR"] = os.path.join(fresh, "triton")
    threads = args.threads or (1 if not args.device.startswith("cuda") else None)
    if threads:
        torch.set_num_threads(threads)
    if args.one is not None:  # a child of the run below: one runner, JSON on stdout
        mode, _, k = args.one.partition(":")
        results, warm_s = measure(args, mode == "on", int(k))
        print(json.dumps({"results": results, "warm_s": warm_s}))
        return 0
    # mode -> class -> [timings], one per trial (fresh process each).
    classes = pick_classes(args.classes)
    modes = ("on",) if args.skip_off else ("off", "on")
    runs: dict[str, dict[str, list[Timings]]] = {"on": {}, "off": {}}
    warm_s: list[float] = []
    for _ in range(args.trials):
        for num_spec in sorted({c.num_spec for c in classes}):
            for mode in modes:
                results, seconds = measure_in_subprocess(argv, mode == "on", num_spec)
                for name, pair in results.items():
                    runs[mode].setdefault(name, []).append(pair)
                if mode == "on":
                    warm_s.append(seconds)
    print(f"first-batch latency / steady-state median ({args.model}, {args.device}, "
          f"compile={'on' if args.compile else 'off'}, {args.repeats} steady steps, "
          f"{args.trials} fresh processes per cell, medians; {args.gap_s:g} s idle before "
          f"each timed step; warmup plan {statistics.median(warm_s):.1f} s per runner)")
    print(f"{'class':<20} {'on: first ms':>13} {'steady ms':>10} {'ratio':>7} "
          f"{'(trials)':>13} {'b2b ms':>8} {'ratio':>6}   {'off: first ms':>14} "
          f"{'steady ms':>10} {'ratio':>8}")
    for cls in classes:
        on = runs["on"][cls.name]
        f_on, s_on, b_on = (statistics.median(x) for x in zip(*on, strict=True))
        each = sorted(t[0] / t[1] for t in on)
        spread = f"{each[0]:.2f}-{each[-1]:.2f}"
        off_cols = f"{'-':>14} {'-':>10} {'-':>8}"
        if cls.name in runs["off"]:
            f_off, s_off, _ = (statistics.median(x) for x in zip(*runs["off"][cls.name],
                                                                 strict=True))
            off_cols = f"{1e3 * f_off:>14.2f} {1e3 * s_off:>10.2f} {f_off / s_off:>8.1f}"
        print(f"{cls.name:<20} {1e3 * f_on:>13.2f} {1e3 * s_on:>10.2f} {f_on / s_on:>7.2f} "
              f"{spread:>13} {1e3 * b_on:>8.2f} {f_on / b_on:>6.2f}   {off_cols}")
    print("steady: the median after the same idle gap as the first batch; b2b: back to back "
          "(the first batch over it includes the host's warm-up from idle)")
    return 0

