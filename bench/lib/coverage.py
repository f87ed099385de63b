"""Coverage workload: after the warmup plan marks the runner ready, random batches from
everything the configuration allows must compile nothing.

    python bench/warm.py coverage --compile --batches 2000
    python bench/warm.py coverage --device cuda \\
        --attention-backend flashinfer --num-speculative-steps 3 --batches 2000
    python bench/warm.py coverage --write-checkpoint llama-3.2-1b --model /tmp/ckpt-1b-text ...
    python bench/warm.py coverage --tensor-parallel-size 2 --batches 600

Requests draw every sampling option at random; with a model that has a tokenizer and EOS ids
(`--write-checkpoint PRESET` writes PRESET's shapes with random weights and a small trained
tokenizer into the --model directory, reused when there), about 30 % of them also carry a
JSON schema, regex or EBNF grammar through xgrammar (devtools/structured_rows.py).

Prints the warmup's phase table, every compile after ready (with the batch that caused it),
a summary of the batches drawn and of the structured requests, one `rank R: ...` line per
tensor-parallel rank (compiles, CUDA-graph misses and communicator set-ups after ready on
that rank; rank 0 alone at TP=1), and last `compiles_after_ready: N` (every rank's). Exits 1
when N > 0, when any rank set up a communicator after ready, or when a grammar let a
forbidden token through or a completed structured output does not parse.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from warmgate.server.devtools.batch_driver import BatchDriver
from warmgate.server.devtools.random_batches import BatchDrawer, Limits
from warmgate.server.devtools.runner_setup import (
    add_runner_args,
    build,
    configure_logging,
    runner_config,
    warm,
)
from warmgate.server.devtools.structured_rows import ConstrainedSampling
from warmgate.server.jit import JitEvent
from warmgate.server.warmup.table import format_phase_table


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_runner_args(p)
    p.add_argument("--batches", type=int, default=2000, help="random batches after ready")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verbose", action="store_true", help="INFO logs (warmup, observers)")
    p.add_argument("--write-checkpoint", metavar="PRESET",
                   help="first write PRESET's shapes (random weights, a trained tokenizer, "
                        "EOS) into the --model directory, kept if there")
    return p


def _sync(runner: object) -> None:
    device = getattr(runner, "device", None)
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_logging(args.verbose)
    if args.write_checkpoint:
        from warmgate.server.devtools.checkpoint import write_checkpoint

        print(write_checkpoint(args.write_checkpoint, Path(args.model), args.device,
                               args.dtype, tokenizer=True), flush=True)
    start = time.perf_counter()
    runner, load_phase, monitor = build(runner_config(args))
    report = warm(runner, load_phase, monitor)
    print(format_phase_table(report), flush=True)
    if not report.succeeded:
        print("warmup failed; nothing to cover", file=sys.stderr)
        return 2
    warm_s = time.perf_counter() - start

    late: list[JitEvent] = []

    def on_event(event: JitEvent) -> None:
        if event.after_ready and event.compiled:
            late.append(event)
            print(f"AFTER READY: {event.describe()}", flush=True)

    monitor.add_listener(on_event)
    cfg = runner.config
    limits = Limits(max_num_seqs=cfg.scheduler.max_num_seqs,
                    max_num_batched_tokens=cfg.scheduler.max_num_batched_tokens,
                    max_model_len=cfg.model.max_model_len,
                    num_spec=cfg.speculative.num_speculative_steps,
                    vocab_size=cfg.model.vocab_size)
    sched = BatchDriver(runner)
    structured = ConstrainedSampling(runner, sched,
                                     random.Random(f"{args.seed}/structured")).install()
    drawer = BatchDrawer(sched, limits, random.Random(args.seed), structured.admit)
    modes: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    sizes: Counter[int] = Counter()
    reqs: Counter[int] = Counter()
    run_start = time.perf_counter()
    for _ in range(args.batches):
        mode, plan = drawer.next_plan()
        sched.step(plan)
        modes[mode] += 1
        shape = monitor.current_batch
        if shape is not None:
            kinds[shape.kind] += 1
            sizes[shape.num_tokens] += 1
            reqs[shape.num_reqs] += 1
    _sync(runner)
    run_s = time.perf_counter() - run_start
    for rid in list(sched.reqs):
        sched.finish(rid)
    sched.flush()
    structured.close()

    counts = monitor.snapshot()
    close = getattr(runner, "close", None)  # tensor parallel: the workers exit, and every
    if close is not None:                   # event they sent has reached rank 0 after it
        close()
    by_rank = monitor.snapshot_by_rank()
    print(f"warmup {warm_s:.1f} s; {args.batches} batches in {run_s:.1f} s "
          f"({1e3 * run_s / max(args.batches, 1):.2f} ms each)")
    print("modes drawn:   " + ", ".join(f"{k} {v}" for k, v in sorted(modes.items())))
    print("batch kinds:   " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
    print(f"token counts:  {len(sizes)} distinct, {min(sizes, default=0)}.."
          f"{max(sizes, default=0)}")
    print("requests/batch: " + ", ".join(f"{k}: {v}" for k, v in sorted(reqs.items())))
    print(structured.describe())
    print(f"observers:     {', '.join(monitor.observers) or 'none'}; compile buckets "
          f"{list(runner.compile_buckets) or 'off'}")
    print(f"compiles before ready: {counts.compiles}; after ready by kind: {counts.after_ready}")
    for rank, c in by_rank.items():
        print(f"rank {rank}: compiles_after_ready={c.total_after_ready} "
              f"cuda_graph_misses_after_ready={c.graph_misses_after_ready} "
              f"communicator_setups_after_ready={c.communicator_setups_after_ready} "
              f"(before ready: compiles {c.compiles}, communicator set-ups "
              f"{c.communicator_setups - c.communicator_setups_after_ready})")
    setups = sum(c.communicator_setups_after_ready for c in by_rank.values())
    print(f"cuda_graph_misses_after_ready: "
          f"{sum(c.graph_misses_after_ready for c in by_rank.values())}")
    print(f"communicator_setups_after_ready: {setups}")
    total = sum(c.total_after_ready for c in by_rank.values())
    print(f"compiles_after_ready: {total}")
    monitor.close()
    return 0 if total == 0 and setups == 0 and structured.ok else 1


if __name__ == "__main__":
    sys.exit(main())
