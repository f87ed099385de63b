"""Where a process's Python time went, from a py-spy raw profile (`py-spy record -f raw`: one
line per distinct stack, its frames `;`-joined, then its sample count).

    python bench/lib/pyspy_summary.py PROFILE [--under ServingLoop.run] [--top 30]

Only the stacks that pass through a frame whose function is --under count (the serving loop,
not the warmup before it). Printed: their samples, the share spent waiting on the GPU (a
torch CUDA event or stream synchronize: what is left is the host's own work), then the
functions by inclusive samples and the lines by self samples, each with its share.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

# "name (path:line)" as py-spy writes a frame; a native frame may lack the parentheses.
_FRAME = re.compile(r"^(?P<name>.*?) \((?P<path>[^()]*?)(?::(?P<line>\d+))?\)$")
# What a host thread does while it waits for the device.
WAITS = ("Event.synchronize", "Stream.synchronize", "synchronize")


@dataclass
class Profile:
    samples: int = 0
    waiting: int = 0
    inclusive: collections.Counter[str] = field(default_factory=collections.Counter)
    own: collections.Counter[str] = field(default_factory=collections.Counter)


def function_of(frame: str) -> str:
    """'name (path)' without the line: a function's samples counted once per stack."""
    m = _FRAME.match(frame)
    return f"{m['name']} ({m['path']})" if m else frame


def name_of(frame: str) -> str:
    m = _FRAME.match(frame)
    return m["name"] if m else frame


def read(lines: Iterable[str], under: str) -> Profile:
    prof = Profile()
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            continue
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not any(name_of(f) == under for f in frames):
            continue
        n = int(count)
        prof.samples += n
        if name_of(frames[-1]) in WAITS:
            prof.waiting += n
        prof.own[frames[-1]] += n
        for fn in {function_of(f) for f in frames}:
            prof.inclusive[fn] += n
    return prof


def report(prof: Profile, under: str, top: int) -> str:
    if not prof.samples:
        return f"no samples under {under}"
    share = 100.0 / prof.samples
    out = [f"{prof.samples} samples under {under}; waiting on the GPU {prof.waiting} "
           f"({prof.waiting * share:.1f} %), the host's own work {prof.samples - prof.waiting} "
           f"({(prof.samples - prof.waiting) * share:.1f} %)",
           "", "inclusive, by function:"]
    out += [f"{n:7d} {n * share:5.1f} %  {fn}" for fn, n in prof.inclusive.most_common(top)]
    out += ["", "self, by line:"]
    out += [f"{n:7d} {n * share:5.1f} %  {frame}" for frame, n in prof.own.most_common(top)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("profile", type=Path, help="a py-spy raw profile")
    p.add_argument("--under", default="ServingLoop.run",
                   help="count only stacks through a frame of this function")
    p.add_argument("--top", type=int, default=30)
    args = p.parse_args(argv)
    with args.profile.open(encoding="utf-8") as f:
        print(report(read(f, args.under), args.under, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
