"""Time to ready of two source trees side by side: warm starts of `warmgate-server` from the
tree given as --base and from this checkout, alternated round by round (which goes first
alternates too), with one --cache-dir, so a drift in the host's speed lands on both.

    python bench/start.py ready-ab --base DIR --cache-dir DIR --rounds 4 -- WARMGATE-SERVER FLAGS

DIR holds the other tree's client/ and server/ (e.g. `git archive REV client server | tar -x
-C DIR`). Fill --cache-dir first (a time_to_ready run with --keep-cache-dir) so both sides
start warm. Each server imports warmgate from its own tree's client/ and server/ (ahead of
anything else on PYTHONPATH) and gets this process's environment without the compiler
caches' variables, which would override --cache-dir. Prints each ready time, then one JSON
line: the runs, the medians and new_over_base.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ready_probe import run_to_ready

ROOT = Path(__file__).resolve().parents[2]
# Set, these would be respected instead of --cache-dir's entry.
COMPILER_CACHE_ENV = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE")


def tree_roots(tree: Path) -> list[str]:
    """The folders a server of `tree` imports warmgate from."""
    return [str(tree / "client"), str(tree / "server")]


def tree_env(tree: Path) -> dict[str, str]:
    """This environment without the compiler caches' variables and without this checkout's
    client/ and server/ on PYTHONPATH (run_to_ready puts `tree`'s ahead of the rest)."""
    env = {k: v for k, v in os.environ.items() if k not in COMPILER_CACHE_ENV}
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
            if p and Path(p).resolve() not in (ROOT / "client", ROOT / "server")]
    env["PYTHONPATH"] = os.pathsep.join(rest)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def order(round_index: int) -> list[str]:
    """Which side starts first in a round: base in even rounds, new in odd ones."""
    return ["base", "new"] if round_index % 2 == 0 else ["new", "base"]


def summary(runs: dict[str, list[float]]) -> dict[str, Any]:
    median = {side: statistics.median(seconds) for side, seconds in runs.items()}
    return {"runs": runs, "median": median,
            "new_over_base": round(median["new"] / median["base"], 3)}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", type=Path, required=True, help="the other tree (client/, server/)")
    p.add_argument("--cache-dir", type=Path, required=True, help="both sides' --cache-dir")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--timeout", type=float, default=180.0, help="seconds per server start")
    p.add_argument("--log-dir", type=Path, help="write each server's stamped log here")
    args = p.parse_args(argv[:split])
    server_argv = [*argv[split + 1:], "--health-port", "0", "--metrics-port", "-1",
                   "--cache-dir", str(args.cache_dir)]
    trees = {"base": args.base.resolve(), "new": ROOT}
    runs: dict[str, list[float]] = {side: [] for side in trees}
    for i in range(args.rounds):
        for side in order(i):
            run = run_to_ready(server_argv, tree_env(trees[side]), args.timeout,
                               roots=tree_roots(trees[side]))
            runs[side].append(round(run.ready_s, 3))
            print(f"round {i} {side}: ready {run.ready_s:.3f} s", flush=True)
            if args.log_dir is not None:
                args.log_dir.mkdir(parents=True, exist_ok=True)
                (args.log_dir / f"{side}-{i}.log").write_text(
                    "".join(f"{at:8.3f} {line}\n" for at, line in run.lines))
    print(json.dumps(summary(runs)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
