"""The smoke's --plan: its scheduler's decisions replayed on the run and ready seconds a table
gives per configuration, for a card of --plan-gib, nothing run (bench/lib/smoke.py)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from smoke_jit import jit_key
from smoke_memory import GIB
from smoke_plan import SmokeConfig, run_order, why_not
from smoke_schedule import alone_backends, format_plan, read_seconds, simulate

PLAN_CAPABILITY = (9, 0)  # --plan's card: an H100's compute capability (FP8 presets allowed)


def replay(args: argparse.Namespace, configs: list[SmokeConfig],
           error: Callable[[str], NoReturn]) -> int:
    """--plan: print each run's start and end and the predicted length; `error` exits with a
    usage error naming the table's problem."""
    try:
        seconds = read_seconds(Path(args.plan).read_text())
    except (OSError, ValueError) as exc:
        error(f"--plan {args.plan}: {exc}")
    total = int(args.plan_gib * GIB)
    runnable = [c for c in configs if why_not(c, total, args.memory_share) is None]
    missing = [c.name for c in runnable if c.name not in seconds]
    if missing:
        error(f"--plan {args.plan}: no seconds for {', '.join(missing)}")
    keys = {c: jit_key(c, "cuda", PLAN_CAPABILITY) for c in runnable}
    queue = run_order(runnable, alone_backends(keys))
    done, left = simulate(queue, keys, {c: seconds[c.name] for c in runnable},
                          {k: args.plan_jit_s for k in keys.values() if k is not None},
                          int(args.memory_share * total), args.parallel, args.deadline_s)
    print(f"{len(runnable)} of {len(configs)} configurations run on {args.plan_gib:.0f} GiB, "
          f"up to {args.parallel} servers at once, FlashInfer prebuilds of "
          f"{args.plan_jit_s:.0f} s")
    print("\n".join(format_plan(done, left, args.deadline_s)))
    return 0
