"""Does every configuration serve? Every preset x attention backend x k in {0, 3}: a fresh
server each (random weights), warmed, then its first/steady TTFT and 50 random Generate
requests with every sampling option (`bench/warm.py served`), one row each.

    python bench/warm.py smoke                       # all of it, on the GPU
    python bench/warm.py smoke --presets qwen3-30b-a3b,tiny --ks 0
    python bench/warm.py smoke --device cpu --presets tiny --backends torch   # a dry run

Servers run side by side where the card's memory holds them (each with a fixed, small KV
cache: bench/lib/smoke_plan.py), the largest first; a configuration that waits for memory at
the queue's head keeps its place: smaller ones start beside the runs only if they also fit
beside it, so it starts once the runs it waited for end (bench/lib/smoke_schedule.py).
FlashInfer's JIT (90-110 s cold) is built once per module set before any FlashInfer server
starts: at the start, one process per key (head size, dtype, tensor-core decode) among the
FlashInfer configurations, all at once, builds the server's own modules into the shared
cache (bench/lib/smoke_jit.py); a key's configurations start once its build has ended, and a
failed build gives them a row that quotes its output. The torch and triton backends' first
runs warm up alone instead (their cold compile is about 15 s): the backend's others start
once it is ready. TTFT is timed in quiet: a ready server times it while every other run is
stopped, and none starts meanwhile (bench/lib/smoke_quiet.py); a row's ready time counts the
seconds it was stopped, and its progress line says how many. A preset the card cannot hold,
or a backend with no kernels for its head size, gets a row that says so instead of a run. No
configuration starts after --deadline-s, and those left get a row that says so: rerun them
with --configs. A run still going at --stop-s is stopped there and its row says so, and the
table follows: a call with a time limit of its own keeps the rows and logs it has.

Each row gives the device memory its processes held at most (peak GiB, sampled from
nvidia-smi about once a second; "-" without it) beside the estimate the packing used (est
GiB), and one line the largest ratio and the most a server held beyond its weights and KV
cache: what --overhead-gib should be (bench/lib/smoke_memory.py). Each run's output is
<logs>/<configuration>.txt, its server's whole log <configuration>.server.txt (where its ready
seconds went, phase by phase), each prebuild's jit-<key>.txt.

    python bench/warm.py smoke --plan rows.txt --backends torch,triton,flashinfer

runs nothing: it replays the same decisions on the run and ready seconds a table gives per
configuration (`# configuration estimate_GiB ran_s stopped_s ready_s` and a row per line)
for a card of --plan-gib, and prints each run's start and end and the predicted length.

A row is clean when the run exited 0 with 0 compiles, autotunes, graph misses and errors
after ready and first/steady TTFT at most --ttft-limit (1.15; a stricter goal, e.g. 1.05 for
the MoE presets at 600 requests, is given there). Exit 0 when every row that ran is clean and
none was left; 1 otherwise.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time
from pathlib import Path

from smoke_jit import PREBUILD_BYTES, JitKey, Prebuild, jit_key
from smoke_memory import GIB, sampler_for, summary
from smoke_plan import (
    HEADER,
    MEMORY_SHARE,
    OVERHEAD_BYTES,
    TTFT_LIMIT,
    SmokeConfig,
    SmokeRow,
    format_row,
    matrix,
    run_order,
    ttft_summary,
    why_not,
)
from smoke_quiet import QuietWindow
from smoke_replay import replay
from smoke_run import Run, log_stem
from smoke_schedule import Gates, Scheduler, alone_backends

from warmgate.server.config.attention_backends import backend_available, backend_names
from warmgate.server.devtools.gpu_card import detect

TAIL = 25  # log lines printed for a run that failed


def _parser(prog: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None, help="default: cuda when there is one, else cpu")
    p.add_argument("--presets", default=None, help="comma-separated (default: every preset)")
    p.add_argument("--backends", default=None,
                   help="comma-separated (default: every backend installed here)")
    p.add_argument("--ks", default="0,3", help="speculative steps, comma-separated")
    p.add_argument("--configs", default=None,
                   help="only these of the matrix, comma-separated preset:backend:kN (as the "
                        "rows name them), e.g. to rerun those a deadline left")
    p.add_argument("--requests", type=int, default=50)
    p.add_argument("--ttft-limit", type=float, default=TTFT_LIMIT,
                   help="first/steady TTFT above this is a fault")
    p.add_argument("--parallel", type=int, default=4, help="servers at once, at most")
    p.add_argument("--overhead-gib", type=float, default=OVERHEAD_BYTES / GIB,
                   help="device memory counted for a server beside its weights and KV cache "
                        "(a run's summary line says the most one held)")
    p.add_argument("--memory-share", type=float, default=MEMORY_SHARE,
                   help="the share of the card the running servers' estimates may add up to")
    p.add_argument("--deadline-s", type=float, default=480.0,
                   help="no configuration starts after this many seconds")
    p.add_argument("--config-timeout-s", type=float, default=300.0,
                   help="a run (or a JIT prebuild) still going after this is stopped")
    p.add_argument("--stop-s", type=float, default=None,
                   help="at this many seconds every run still going is stopped, its row says "
                        "so, and the table is printed: under a time limit of its own, the "
                        "smoke ends before it with the rows it has (default: no such stop)")
    p.add_argument("--logs", default=None, help="each run's output here (default: a temp dir)")
    p.add_argument("--plan", default=None, metavar="FILE",
                   help="run nothing: print the order and predicted length of a run on a "
                        "card of --plan-gib, from the run and ready seconds FILE gives per "
                        "configuration (a table with a '# configuration ... ran_s ... "
                        "ready_s' header line)")
    p.add_argument("--plan-gib", type=float, default=79.0, help="--plan's card memory")
    p.add_argument("--plan-jit-s", type=float, default=110.0,
                   help="--plan's seconds for each FlashInfer JIT prebuild")
    return p


def _total_bytes(device: str) -> int:
    import torch

    if device.startswith("cuda"):
        return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _select(args: argparse.Namespace, prog: str | None) -> tuple[list[SmokeConfig], list[str]]:
    """The configurations the flags name, and the backends."""
    backends = (args.backends.split(",") if args.backends else
                [b for b in backend_names() if backend_available(b)])
    try:
        configs = matrix(args.presets.split(",") if args.presets else None, backends,
                         [int(k) for k in args.ks.split(",")], int(args.overhead_gib * GIB))
    except ValueError as exc:
        _parser(prog).error(str(exc))
    if args.configs:
        wanted = set(args.configs.split(","))
        unknown = sorted(wanted - {c.name for c in configs})
        if unknown:
            _parser(prog).error(f"--configs {','.join(unknown)}: not in the matrix")
        configs = [c for c in configs if c.name in wanted]
    return configs, backends


def _prebuilds(keys: dict[SmokeConfig, JitKey | None], device: str, logs: Path
               ) -> list[Prebuild]:
    """Every JIT key's build, all at once (nvcc runs on the CPU; each holds little memory)."""
    builds = [Prebuild(key, device, logs / f"{key.stem}.txt")
              for key in sorted({k for k in keys.values() if k is not None})]
    for build in builds:
        print(f"FlashInfer JIT prebuild: {build.key.name} "
              f"({sum(k == build.key for k in keys.values())} configurations wait for it)",
              flush=True)
    return builds


def _run_all(queue: list[SmokeConfig], keys: dict[SmokeConfig, JitKey | None], device: str,
             total: int, args: argparse.Namespace, logs: Path
             ) -> tuple[list[SmokeRow], list[SmokeConfig], str]:
    """Run the queue (see the module's docstring); the rows of the runs and of those a failed
    prebuild kept from running, the configurations left, and why they were (the deadline or
    --stop-s)."""
    gates = Gates(keys)
    scheduler = Scheduler(int(args.memory_share * total), args.parallel)
    running: list[Run] = []
    done: list[SmokeRow] = []
    quiet, memory = QuietWindow(), sampler_for(device)
    start = time.monotonic()
    builds = _prebuilds(keys, device, logs)
    try:
        while queue or running:
            cut = (f"cut at --stop-s {args.stop_s:.0f}" if args.stop_s is not None
                   and time.monotonic() - start >= args.stop_s else None)
            for build in [b for b in builds if b.poll(args.config_timeout_s)]:
                builds.remove(build)
                print(f"[+{time.monotonic() - start:4.0f} s] FlashInfer JIT prebuild "
                      f"{build.key.name}: {'built' if build.ok else 'FAILED'} in "
                      f"{build.seconds:.0f} s", flush=True)
                if build.ok:
                    gates.built.add(build.key)
                for config in [c for c in queue if keys[c] == build.key and not build.ok]:
                    queue.remove(config)
                    done.append(SmokeRow(config, note=f"not run: {build.note}"))
            configs = [r.row.config for r in running]  # grows as runs start: the gates see them
            may_start = functools.partial(gates.may_start, running=configs)
            while (queue and not quiet.open and not cut
                   and time.monotonic() - start < args.deadline_s):
                config = scheduler.pick(queue, configs, may_start,
                                        held=PREBUILD_BYTES * len(builds))
                if config is None:
                    break
                queue.remove(config)
                running.append(Run(config, device, args, logs))
                configs.append(config)
            if not running and time.monotonic() - start >= args.deadline_s:
                break
            if not quiet.open:  # no nvidia-smi beside a TTFT being timed in quiet
                memory.sample(r.session for r in running)
            for run in running:
                if not run.warming:  # ready: its backend's cold compile is in the caches
                    gates.compiled(run.row.config.backend)
            for run in [r for r in running if r.poll(args.config_timeout_s, cut)]:
                running.remove(run)
                gates.compiled(run.row.config.backend)
                run.row.peak_bytes = memory.peak(run.session)
                done.append(run.row)
                print(f"[+{time.monotonic() - start:4.0f} s, ran {run.row.wall_s:3.0f} s, "
                      f"stopped {run.paused_s:3.0f} s] {format_row(run.row)}", flush=True)
            if cut:
                return done, queue, f"not run: {cut}"
            quiet.step(running, builds)
            time.sleep(0.2)
    finally:
        quiet.close()  # nothing left stopped, whatever ended the loop
        for build in builds:
            build.kill()
    return done, queue, f"not run: past --deadline-s {args.deadline_s:.0f}"


def _report(rows: dict[SmokeConfig, SmokeRow], logs: Path) -> int:
    print(HEADER)
    for row in rows.values():
        print(format_row(row))
    ran = [r for r in rows.values() if r.exit_code is not None]
    dirty = [r for r in ran if not r.clean]
    left = [r for r in rows.values() if r.note.startswith("not run")]
    print(f"{len(rows)} configurations: {len(ran) - len(dirty)} clean, {len(dirty)} not clean, "
          f"{len(rows) - len(ran) - len(left)} do not fit or apply, {len(left)} not run")
    print(summary(ran))
    if ttft_line := ttft_summary(ran):
        print(ttft_line)
    for row in ran:
        if row.exit_code:  # what the run said last: why it failed
            lines = (logs / (log_stem(row.config) + ".txt")).read_text(
                errors="replace").splitlines()
            print(f"\n--- {row.config.name}: the last {min(len(lines), TAIL)} lines of its log")
            print("\n".join(line[:300] for line in lines[-TAIL:]))
    return 1 if dirty or left else 0


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    import torch

    args = _parser(prog).parse_args(argv)
    configs, backends = _select(args, prog)
    if args.plan:
        return replay(args, configs, _parser(prog).error)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    card = detect(device)
    if device.startswith("cuda"):
        torch.cuda.empty_cache()  # the copy check's 2 GiB back before any server starts
    total = _total_bytes(device)
    logs = Path(args.logs or tempfile.mkdtemp(prefix="warmgate-smoke-"))
    logs.mkdir(parents=True, exist_ok=True)
    print(card.describe())
    print(f"{len(configs)} configurations ({', '.join(backends)}; k {args.ks}), "
          f"{total / GIB:.0f} GiB, up to {args.parallel} servers at once; logs in {logs}",
          flush=True)
    rows = {c: SmokeRow(c, note=why_not(c, total, args.memory_share) or "") for c in configs}
    runnable = [c for c in configs if not rows[c].note]
    keys = {c: jit_key(c, device) for c in runnable}
    start = time.monotonic()
    done, left, why_left = _run_all(run_order(runnable, alone_backends(keys)),
                          keys, device, total, args, logs)
    for row in done:
        rows[row.config] = row
    for config in left:
        rows[config].note = why_left
    print(f"\nsmoke, {device}, {time.monotonic() - start:.0f} s")
    return _report(rows, logs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
