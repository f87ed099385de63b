"""Where a start-up's Python time goes: every thread's stack, sampled while
`warmgate-server --warmup-only` loads and warms up in this process.

    python bench/start.py profile [--interval-ms 2] [--top 25] -- WARMGATE-SERVER FLAGS

Run it with the --cache-dir of an earlier start to see a warm start. A thread of its own reads
sys._current_frames() every interval and counts, per thread, the innermost frame of each
stack (where the thread was), every function on it (what it was inside) and its innermost
frames together (how it got there), each sample
weighted by the seconds since the one before (a sample waits for the GIL while a thread holds
it), and prints the top frames and functions of each thread in seconds. Only Python
frames are seen: a thread inside a C call (a CUDA synchronize, cuBLAS choosing an algorithm, a
file read) counts for the Python line that made the call. The sampler takes the GIL for each
sample, so a start-up profiled runs a little slower than one that is not.
It also counts the garbage collector's passes (gc.callbacks): how many per generation, their
seconds, and the longest, on whichever thread they ran.
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

HARNESS = str(Path(__file__).resolve().parent)  # bench/lib/
Counts = dict[str, collections.Counter[str]]  # thread -> where -> seconds
STACK_DEPTH = 8  # frames of a stack kept for the "how it got there" table


def _where(frame: FrameType, line: bool) -> str:
    code = frame.f_code
    path = code.co_filename
    short = "/".join(path.split(os.sep)[-2:])
    return f"{short}:{frame.f_lineno if line else code.co_firstlineno} {code.co_name}"


class StackSampler:
    """Samples every other thread's Python stack until stopped."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.leaf: Counts = collections.defaultdict(collections.Counter)
        self.inside: Counts = collections.defaultdict(collections.Counter)
        # thread -> the STACK_DEPTH innermost frames, innermost first, joined -> seconds
        self.stacks: Counts = collections.defaultdict(collections.Counter)
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="startup-profile", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self, frames: dict[int, FrameType], names: dict[int, str],
               seconds: float) -> None:
        """Count each thread's stack for the `seconds` since the last sample."""
        self.samples += 1
        for ident, frame in frames.items():
            name = names.get(ident, str(ident))
            self.leaf[name][_where(frame, line=True)] += seconds
            seen: set[str] = set()
            chain: list[str] = []
            walk: FrameType | None = frame
            while walk is not None:
                # This script and the entry point that ran it sit on every stack of the
                # main thread and say nothing of where the start-up goes.
                if not walk.f_code.co_filename.startswith(HARNESS):
                    seen.add(_where(walk, line=False))
                if len(chain) < STACK_DEPTH:
                    chain.append(_where(walk, line=True))
                walk = walk.f_back
            self.stacks[name][" <- ".join(chain)] += seconds
            for where in seen:
                self.inside[name][where] += seconds

    def _run(self) -> None:
        me = threading.get_ident()
        last = time.perf_counter()
        while not self._stop.wait(self.interval_s):
            names = {t.ident: t.name for t in threading.enumerate() if t.ident is not None}
            frames = {k: v for k, v in sys._current_frames().items() if k != me}
            now = time.perf_counter()
            self.sample(frames, names, now - last)
            last = now


class CollectorTimer:
    """The garbage collector's passes while installed: count, seconds and longest, by
    generation."""

    def __init__(self) -> None:
        self.count: collections.Counter[int] = collections.Counter()
        self.seconds: collections.Counter[int] = collections.Counter()
        self.longest: dict[int, float] = {}
        self._started: dict[int, float] = {}  # thread -> start of its pass

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        me = threading.get_ident()
        if phase == "start":
            self._started[me] = time.perf_counter()
            return
        seconds = time.perf_counter() - self._started.pop(me, time.perf_counter())
        generation = info["generation"]
        self.count[generation] += 1
        self.seconds[generation] += seconds
        self.longest[generation] = max(self.longest.get(generation, 0.0), seconds)

    def lines(self) -> list[str]:
        total = sum(self.seconds.values())
        out = [f"garbage collector: {sum(self.count.values())} passes, {total:.3f} s"]
        out += [f"  generation {g}: {self.count[g]} passes, {self.seconds[g]:.3f} s, longest "
                f"{1e3 * self.longest[g]:.1f} ms" for g in sorted(self.count)]
        return out


def report(sampler: StackSampler, top: int, wall_s: float) -> list[str]:
    lines = [f"{sampler.samples} samples, one every {1e3 * sampler.interval_s:.1f} ms or more, "
             f"over {wall_s:.2f} s of wall time"]
    for name in sorted(sampler.leaf, key=lambda n: -sum(sampler.leaf[n].values())):
        lines.append(f"thread {name}: {sum(sampler.leaf[name].values()):.2f} s sampled")
        lines.append("  where it was (innermost frame):")
        lines += [f"    {s:7.3f} s  {where}" for where, s in sampler.leaf[name].most_common(top)]
        lines.append("  what it was inside (any frame of the stack):")
        lines += [f"    {s:7.3f} s  {where}"
                  for where, s in sampler.inside[name].most_common(top)]
        lines.append(f"  how it got there ({STACK_DEPTH} innermost frames, innermost first):")
        lines += [f"    {s:7.3f} s  {where}"
                  for where, s in sampler.stacks[name].most_common(top)]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--interval-ms", type=float, default=2.0)
    p.add_argument("--top", type=int, default=25, help="lines per table")
    args = p.parse_args(argv[:split])
    server_argv = [*argv[split + 1:], "--warmup-only"]
    from warmgate.server.main import main as server_main

    sampler = StackSampler(args.interval_ms / 1e3)
    collector = CollectorTimer()
    start = time.perf_counter()
    gc.callbacks.append(collector)
    sampler.start()
    try:
        code = server_main(server_argv)
    finally:
        sampler.stop()
        gc.callbacks.remove(collector)
    print("\n".join(collector.lines() + report(sampler, args.top, time.perf_counter() - start)),
          flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
