"""First-batch latency after ready, per batch class, divided by that class's steady-state
median: with the warmup plan run before ready, and with it disabled.

    PYTHONPATH=client:server:. python bench/first_batch.py --compile

A ratio near 1 means the first request of that shape costs what every later one does; the
"warmup off" column shows what a request pays when the plan did not run (torch.compile
buckets, Triton/FlashInfer JIT and first-use costs land on it). Every runner (warmup off and
on, per speculative length) is measured in a fresh process with torch.compile's and Triton's
caches pointed at a fresh directory, as on a new pod: nothing one runner ran (kernels loaded,
cuBLAS algorithm choices, graph uploads) helps another. Within a runner, classes run in the
order listed, so a later class can find what an earlier one touched, as in a server.

Every timed step (the first included) follows the same idle gap (--gap-s), as requests do in
a server: a host-bound step right after a pause or after other work runs slower than the same
step back to back (cold CPU caches and clocks; bench/first_probe.py measures it), so comparing
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
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from bench.coverage_scheduler import CoverageScheduler, Request, Work
from bench.inprocess import add_runner_args, build, configure_logging, runner_config, warm
from warmgate.server.runner.scheduler_output import GREEDY, SamplingParams
from warmgate.server.warmup.kernels import SEEDED, STOCHASTIC
from warmgate.server.warmup.sampler_rows import TEMPERATURE_ONLY  # no top-k/top-p

# A decode's untimed set-up prefills PROMPT_LEN - 1 = 32 tokens per request: a compile bucket
# (32, 128) that none of the timed steps (4, 16, 96 tokens) uses, so set-up warms nothing
# that a timed first batch would otherwise pay for.
PROMPT_LEN = 33
NUM_REQS = 4


def sync(sched: CoverageScheduler) -> None:
    if sched.runner.device.type == "cuda":
        torch.cuda.synchronize(sched.runner.device)


class Case:
    """Builds requests with ids unique per case, so cases can share one scheduler, and
    times steps, each after `gap_s` of idleness."""

    def __init__(self, sched: CoverageScheduler, name: str, rng: random.Random,
                 gap_s: float = 0.0) -> None:
        self.sched, self.name, self.rng, self.gap_s = sched, name, rng, gap_s
        self._n = 0

    def timed(self, plan: dict[str, Work]) -> float:
        sync(self.sched)
        if self.gap_s:
            time.sleep(self.gap_s)
        start = time.perf_counter()
        self.run_step(plan)
        return time.perf_counter() - start

    def run_step(self, plan: dict[str, Work]) -> None:
        """The timed part: the step and the sync that ends it (a subclass may wrap it)."""
        self.sched.step(plan)
        sync(self.sched)

    def request(self, prompt_len: int, params: SamplingParams) -> Request:
        self._n += 1
        vocab = self.sched.runner.config.model.vocab_size
        req = Request(f"{self.name}{self._n}",
                      [self.rng.randrange(vocab) for _ in range(prompt_len)], params, 10**6)
        self.sched.add(req)
        return req

    def drafts(self, k: int) -> tuple[int, ...]:
        vocab = self.sched.runner.config.model.vocab_size
        return tuple(self.rng.randrange(vocab) for _ in range(k))


def prefill(case: Case, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats + 1):
        reqs = [case.request(24, STOCHASTIC) for _ in range(NUM_REQS)]
        times.append(case.timed({r.req_id: Work(24) for r in reqs}))
        for r in reqs:
            case.sched.finish(r.req_id)
    return times


def decode(params: SamplingParams, k: int) -> Callable[[Case, int], list[float]]:
    """Untimed: each prompt but its last token, so nothing is sampled before the timed steps;
    timed: the last prompt token (+ k drafts) - a uniform decode that samples - then more."""

    def run(case: Case, repeats: int) -> list[float]:
        reqs = [case.request(PROMPT_LEN, params) for _ in range(NUM_REQS)]
        case.sched.step({r.req_id: Work(PROMPT_LEN - 1) for r in reqs})
        times = [case.timed({r.req_id: Work(1 + k, case.drafts(k)) for r in reqs})
                 for _ in range(repeats + 1)]
        for r in reqs:
            case.sched.finish(r.req_id)
        return times

    return run


def mixed(case: Case, repeats: int) -> list[float]:
    """One request decoding beside a new 15-token prefill, as the warmup's mixed step."""
    decoding = case.request(PROMPT_LEN, STOCHASTIC)
    case.sched.step({decoding.req_id: Work(PROMPT_LEN - 1)})
    times = []
    for _ in range(repeats + 1):
        fresh = case.request(15, STOCHASTIC)
        times.append(case.timed({decoding.req_id: Work(1), fresh.req_id: Work(15)}))
        case.sched.finish(fresh.req_id)
    case.sched.finish(decoding.req_id)
    return times


@dataclass(frozen=True)
class BatchClass:
    name: str
    num_spec: int  # the runner it needs
    run: Callable[[Case, int], list[float]]


CLASSES = (
    BatchClass("prefill", 0, prefill),
    BatchClass("decode k=0", 0, decode(STOCHASTIC, 0)),
    BatchClass("mixed", 0, mixed),
    BatchClass("sampler greedy", 0, decode(GREEDY, 0)),
    BatchClass("sampler temperature", 0, decode(TEMPERATURE_ONLY, 0)),
    BatchClass("sampler seeded", 0, decode(SEEDED, 0)),
    BatchClass("decode k=3", 3, decode(STOCHASTIC, 3)),
)


Timings = tuple[float, float, float]  # first s, steady median s, back-to-back median s


def selected(args: argparse.Namespace) -> tuple[BatchClass, ...]:
    """The classes --classes names (all by default)."""
    if not args.classes:
        return CLASSES
    names = [n.strip() for n in args.classes.split(",")]
    unknown = [n for n in names if n not in {c.name for c in CLASSES}]
    if unknown:
        raise SystemExit(f"--classes: {unknown} are not batch classes; choose from "
                         f"{[c.name for c in CLASSES]}")
    return tuple(c for c in CLASSES if c.name in names)


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
    sched = CoverageScheduler(runner)
    rng = random.Random(args.seed)
    classes = [c for c in selected(args) if c.num_spec == num_spec]
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
    # The child imports bench.* as this process does, whatever PYTHONPATH it was given.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, __file__, *argv, "--one", one], check=True,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": path})
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    return {k: (v[0], v[1], v[2]) for k, v in data["results"].items()}, data["warm_s"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
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
    argv = sys.argv[1:] if argv is None else argv
    # mode -> class -> [timings], one per trial (fresh process each).
    classes = selected(args)
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


if __name__ == "__main__":
    sys.exit(main())
