"""The garbage collector's pauses in the first serving steps after a warmup: with the heap
freeze the server runs before SERVING (control/heap_freeze.py) vs without it, side by side.

    python bench/warm.py gc-after-warmup [--steps 20 --rounds 2 --prompt-len 128]
        (and any other server flag; defaults: the tiny model on the CPU)

Each arm runs in a fresh process, as a server starts: main's import freeze (the imports and
the configuration with the collector off, then gc.freeze: control/import_collection.py), the
model loaded and warmed in that process (local_engine, load, run_plan, as --warmup-only
does); then the `freeze` arm collects and freezes as the server does before SERVING, and the
`no freeze` arm goes straight on. Then --steps Generate-like serving steps: a request with a
random prompt arrives before every step while the earlier ones decode, and each step's events
become GenerateResponse messages, as the Generate stream builds them. gc.callbacks time every
collection from start to stop, by generation.

Prints per arm and round: collections and milliseconds per generation during the steps, the
objects the collector still walks when the first step starts, and the freeze's own cost (paid
before SERVING); then the pause ratio (no freeze / freeze, medians over the rounds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

ARMS = ("no freeze", "freeze")
GENERATIONS = (0, 1, 2)


class CollectorClock:
    """Every collection's seconds from its start to its stop, by generation (gc.callbacks)."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(GENERATIONS, 0.0)
        self.counts = dict.fromkeys(GENERATIONS, 0)
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        generation = info["generation"]
        self.seconds[generation] += time.perf_counter() - self._started
        self.counts[generation] += 1


def measure(argv: list[str], freeze: bool, steps: int, prompt_len: int) -> dict[str, Any]:
    """One arm in this (fresh) process: the numbers of its steps."""
    from warmgate.server.control.import_collection import collector_off_for_imports

    with collector_off_for_imports() as imports_done:  # as main.main does
        import gc
        import random

        import torch

        from warmgate.server import main as server_main  # what main imports before it

        config = server_main.load_server_config(argv)
        imports_done()
        # What the server imports after the freeze (app, gRPC, the serving loop), young.
        from warmgate.server.app import local_engine
        from warmgate.server.control.heap_freeze import freeze_warm_heap
        from warmgate.server.runner.scheduler_output import SamplingParams
        from warmgate.server.serving.limits import SchedulerLimits
        from warmgate.server.serving.loop import ServingLoop
        from warmgate.server.serving.request import ServingRequest, StepEvent
        from warmgate.server.serving.scheduler import Scheduler
        from warmgate.v1 import generate_pb2

        torch.set_num_threads(1)  # a shared CPU: the forward is not what is measured
        engine = local_engine(config)
        if not engine.load().ok:
            raise SystemExit("the model did not load")
        report = engine.run_plan(mixed_num_tokens=config.mixed_num_tokens, force=False,
                                 progress=lambda event: None)
        if not report.succeeded:
            raise SystemExit(f"the warmup failed: {report.outcome}")
        runner = engine.runner
        assert runner is not None  # loaded above
        frozen = freeze_warm_heap("bench", runner).__dict__ if freeze else None
        arrival = time.perf_counter()

        def respond(events: list[StepEvent]) -> None:
            for e in events:
                generate_pb2.GenerateResponse(token_ids=e.token_ids,
                                              time_since_arrival_s=e.time_s - arrival)

        limits = SchedulerLimits.of_config(
            config.runner, async_scheduling=config.serving.async_scheduling)
        loop = ServingLoop(runner, Scheduler(limits), respond)
        rng = random.Random(0)
        vocab = config.runner.model.vocab_size
        params = SamplingParams(temperature=0.0, max_tokens=16)
        tracked = len(gc.get_objects())
        pending = gc.get_count()  # what decides when the next collections fire
        clock = CollectorClock()
        gc.callbacks.append(clock)
        start = time.perf_counter()
        for i in range(steps):
            loop.submit(ServingRequest(f"r{i}", [rng.randrange(vocab) for _ in range(prompt_len)],
                                       params, time.perf_counter()))
            loop.step()
        wall = time.perf_counter() - start
        gc.callbacks.remove(clock)
        # The first full collection after ready, whenever it comes: forced here, timed.
        walked = len(gc.get_objects())
        full_start = time.perf_counter()
        gc.collect()
        full_ms = (time.perf_counter() - full_start) * 1e3
    return {"seconds": clock.seconds, "counts": clock.counts, "tracked": tracked,
            "pending": pending, "frozen": frozen, "wall_s": wall, "full_ms": full_ms,
            "full_walked": walked}


def arm_in_subprocess(argv: list[str], freeze: bool, steps: int, prompt_len: int
                      ) -> dict[str, Any]:
    """One arm in a fresh interpreter: its collector starts as a server's does."""
    out = subprocess.run([sys.executable, __file__, "--arm", "freeze" if freeze else "none",
                          "--steps", str(steps), "--prompt-len", str(prompt_len), *argv],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"the {'freeze' if freeze else 'no freeze'} arm failed:\n{out.stderr}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def pause_ms(result: dict[str, Any]) -> float:
    return float(sum(result["seconds"].values())) * 1e3


def row(label: str, result: dict[str, Any]) -> str:
    gens = "".join(f"{result['counts'][str(g)]:>6} {result['seconds'][str(g)] * 1e3:>8.1f}"
                   for g in GENERATIONS)
    frozen = result["frozen"]
    freeze = (f"{frozen['ms']:>7.1f} ms, {frozen['collected']} collected, "
              f"{frozen['frozen']} frozen" if frozen else "-")
    return (f"{label:<12}{gens}{pause_ms(result):>10.1f}{result['wall_s'] * 1e3:>10.1f}"
            f"{result['tracked']:>9} {tuple(result['pending'])!s:>13}"
            f"{result['full_walked']:>8} {result['full_ms']:>7.1f}  {freeze}")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--steps", type=int, default=20, help="serving steps after the warmup")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2, help="runs of each arm, alternated")
    p.add_argument("--arm", choices=("freeze", "none"), help=argparse.SUPPRESS)
    args, server_flags = p.parse_known_args(argv)
    server_argv = ["--model", "tiny", "--device", "cpu", "--port", "0", *server_flags]
    if args.arm is not None:
        print(json.dumps(measure(server_argv, args.arm == "freeze", args.steps,
                                 args.prompt_len)))
        return 0
    results: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    rows = []
    for i in range(args.rounds):  # alternated, so drift in the machine's load hits both
        for arm in ARMS:
            results[arm].append(arm_in_subprocess(server_flags, arm == "freeze", args.steps,
                                                  args.prompt_len))
            rows.append(row(f"{arm} #{i + 1}", results[arm][-1]))
    print(f"the first {args.steps} serving steps after a warmup, a {args.prompt_len}-token "
          f"request arriving before each; flags {' '.join(server_argv)}; each arm a fresh "
          "process with main's import freeze")
    print(f"{'arm':<12}" + "".join(f"{f'gen{g} n':>7} {'ms':>7}" for g in GENERATIONS)
          + f"{'pause ms':>10}{'steps ms':>10}{'tracked':>9} {'gc counts':>13}"
          f"{'full: walks':>12} {'ms':>7}  the freeze before ready")
    print("\n".join(rows))
    print("gen<g> n/ms: collections of that generation during the steps and their pause; "
          "tracked / gc counts: the objects the collector walks and gc.get_count() as the "
          "first step starts; full: a full collection forced after the steps (the first "
          "one after ready, whenever it comes), the objects it walks and its ms")
    for label, value in (("collector pause in the steps", pause_ms),
                         ("the first full collection", lambda r: float(r["full_ms"]))):
        without = statistics.median(value(r) for r in results["no freeze"])
        frozen = statistics.median(value(r) for r in results["freeze"])
        print(f"{label}, median over rounds: {without:.1f} ms without the freeze, "
              f"{frozen:.1f} ms with it, ratio {_ratio(without, frozen)}")
    full = {arm: statistics.median(r["counts"]["2"] for r in results[arm]) for arm in ARMS}
    print(f"full (gen2) collections during the steps: {full['no freeze']:g} without the "
          f"freeze, {full['freeze']:g} with it")
    return 0


def _ratio(without: float, frozen: float) -> str:
    if frozen > 0:
        return f"{without / frozen:.1f}"
    return "n/a (no pause either way)" if without == 0 else "inf (no pause with the freeze)"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
