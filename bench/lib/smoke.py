"""Does every configuration serve? Every preset x attention backend x k in {0, 3}: a fresh
server each (random weights), warmed, then its first/steady TTFT and 50 random Generate
requests with every sampling option (`bench/warm.py served`), one row each.

    python bench/warm.py smoke                       # all of it, on the GPU
    python bench/warm.py smoke --presets qwen3-30b-a3b,tiny --ks 0
    python bench/warm.py smoke --device cpu --presets tiny --backends torch   # a dry run

Servers run side by side where the card's memory holds them (each with a fixed, small KV
cache: bench/lib/smoke_plan.py), the largest first; each backend's first run goes alone, so
its cold JIT is paid once. TTFT is timed in quiet: a ready server times it while every other
run is stopped, and none starts meanwhile (bench/lib/smoke_quiet.py); a row's ready time
counts the seconds it was stopped, and its progress line says how many. A preset the card
cannot hold, or a backend with no kernels for its head size, gets a row that says so instead
of a run. No configuration starts after --deadline-s, and those left get a row that says
so: rerun them with --presets.

A row is clean when the run exited 0 with 0 compiles, autotunes, graph misses and errors
after ready and first/steady TTFT at most --ttft-limit (1.15; a stricter goal, e.g. 1.05 for
the MoE presets at 600 requests, is given there). Exit 0 when every row that ran is clean and
none was left; 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from smoke_plan import (
    HEADER,
    MEMORY_SHARE,
    TTFT_LIMIT,
    SmokeConfig,
    SmokeRow,
    format_row,
    matrix,
    memory_bytes,
    read_served,
    run_order,
    why_not,
)
from smoke_quiet import ProcessGroupPause, QuietWindow

from warmgate.server.config.attention_backends import backend_available, backend_names
from warmgate.server.devtools.gpu_card import detect

WARM = str(Path(__file__).resolve().parents[1] / "warm.py")
GIB = 2**30
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
    p.add_argument("--deadline-s", type=float, default=480.0,
                   help="no configuration starts after this many seconds")
    p.add_argument("--config-timeout-s", type=float, default=300.0)
    p.add_argument("--logs", default=None, help="each run's output here (default: a temp dir)")
    return p


def _total_bytes(device: str) -> int:
    import torch

    if device.startswith("cuda"):
        return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class Run:
    """One configuration's `bench/warm.py served` in a session of its own (its server is in
    it too, so a timeout stops both)."""

    def __init__(self, config: SmokeConfig, device: str, args: argparse.Namespace,
                 logs: Path) -> None:
        self.row = SmokeRow(config, ttft_limit=args.ttft_limit)
        self.started = time.monotonic()
        stem = config.name.replace(":", "-")
        self.log = logs / (stem + ".txt")
        self.gate = str(logs / stem)  # served's --ttft-gate files
        self.note = ""  # what the quiet window says of its TTFT, if anything
        self._out = self.log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, WARM, "served", "--requests", str(args.requests), "--repeats", "5",
             "--gap-s", "0.3", "--ttft-gate", self.gate,
             "--server-args", config.server_args(device)],
            stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True)
        self._pause = ProcessGroupPause(self.proc.pid)  # its session's group: pgid == pid

    def pause(self) -> None:
        self._pause.pause()

    def resume(self) -> None:
        self._pause.resume()

    @property
    def paused_s(self) -> float:
        return self._pause.stopped_s()

    def _has(self, suffix: str) -> bool:
        return os.path.exists(self.gate + suffix)

    @property
    def warming(self) -> bool:
        return not self._has(".ready")

    @property
    def waiting(self) -> bool:
        return self._has(".ready") and not self._has(".go")

    @property
    def timing(self) -> bool:
        return self._has(".go") and not self._has(".measured")

    def go(self) -> None:
        Path(self.gate + ".go").touch()

    def poll(self, timeout_s: float) -> bool:
        """Whether the run has ended (killed now if past its time, the seconds others' TTFT
        kept it stopped not counted)."""
        if self.proc.poll() is None:
            if time.monotonic() - self.started - self.paused_s < timeout_s:
                return False
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.row.note = f"timed out after {timeout_s:.0f} s"
        self._out.close()
        self.row.wall_s = time.monotonic() - self.started
        self.row.exit_code = self.proc.returncode
        output = self.log.read_text(errors="replace")
        read_served(self.row, output)
        if not self.row.clean and not self.row.note:
            self.row.note = "; ".join([*self.row.faults(), *filter(None, [self.note])])
            if self.row.exit_code:
                lines = [ln for ln in output.splitlines() if ln.strip()]
                self.row.note += f" ({self.log.name}: {lines[-1][:100] if lines else 'no output'})"
        return True


def _schedule(queue: list[SmokeConfig], running: list[Run], gated: set[str],
              free_bytes: int) -> SmokeConfig | None:
    """The next configuration that may start now (no server times its TTFT meanwhile): its
    backend's first run has ended (or it is that run), and it fits beside those running."""
    for config in queue:
        if config.backend in gated and any(r.row.config.backend == config.backend
                                           for r in running):
            continue
        if memory_bytes(config) <= free_bytes or not running:
            return config
    return None


def _select(args: argparse.Namespace, prog: str | None) -> tuple[list[SmokeConfig], list[str]]:
    """The configurations the flags name, and the backends."""
    backends = (args.backends.split(",") if args.backends else
                [b for b in backend_names() if backend_available(b)])
    try:
        configs = matrix(args.presets.split(",") if args.presets else None, backends,
                         [int(k) for k in args.ks.split(",")])
    except ValueError as exc:
        _parser(prog).error(str(exc))
    if args.configs:
        wanted = set(args.configs.split(","))
        unknown = sorted(wanted - {c.name for c in configs})
        if unknown:
            _parser(prog).error(f"--configs {','.join(unknown)}: not in the matrix")
        configs = [c for c in configs if c.name in wanted]
    return configs, backends


def _run_all(queue: list[SmokeConfig], backends: list[str], device: str, total: int,
             args: argparse.Namespace, logs: Path) -> tuple[list[SmokeRow], list[SmokeConfig]]:
    """Run the queue (see the module's docstring); the rows of the runs, and the
    configurations the deadline left."""
    gated = set(backends)  # each backend's first run has not ended yet
    running: list[Run] = []
    done: list[SmokeRow] = []
    quiet = QuietWindow()
    start = time.monotonic()
    try:
        while queue or running:
            used = sum(memory_bytes(r.row.config) for r in running)
            while (queue and not quiet.open and len(running) < args.parallel
                   and time.monotonic() - start < args.deadline_s):
                config = _schedule(queue, running, gated, int(MEMORY_SHARE * total) - used)
                if config is None:
                    break
                queue.remove(config)
                running.append(Run(config, device, args, logs))
                used += memory_bytes(config)
            if not running and time.monotonic() - start >= args.deadline_s:
                break
            for run in [r for r in running if r.poll(args.config_timeout_s)]:
                running.remove(run)
                gated.discard(run.row.config.backend)
                done.append(run.row)
                print(f"[+{time.monotonic() - start:4.0f} s, ran {run.row.wall_s:3.0f} s, "
                      f"stopped {run.paused_s:3.0f} s] {format_row(run.row)}", flush=True)
            quiet.step(running)
            time.sleep(0.2)
    finally:
        quiet.close()  # nothing left stopped, whatever ended the loop
    return done, queue


def _report(rows: dict[SmokeConfig, SmokeRow], logs: Path) -> int:
    print(HEADER)
    for row in rows.values():
        print(format_row(row))
    ran = [r for r in rows.values() if r.exit_code is not None]
    dirty = [r for r in ran if not r.clean]
    left = [r for r in rows.values() if r.note.startswith("not run")]
    print(f"{len(rows)} configurations: {len(ran) - len(dirty)} clean, {len(dirty)} not clean, "
          f"{len(rows) - len(ran) - len(left)} do not fit or apply, {len(left)} not run")
    for row in ran:
        if row.exit_code:  # what the run said last: why it failed
            lines = (logs / (row.config.name.replace(":", "-") + ".txt")).read_text(
                errors="replace").splitlines()
            print(f"\n--- {row.config.name}: the last {min(len(lines), TAIL)} lines of its log")
            print("\n".join(line[:300] for line in lines[-TAIL:]))
    return 1 if dirty or left else 0


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    import torch

    args = _parser(prog).parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    configs, backends = _select(args, prog)
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
    rows = {c: SmokeRow(c, note=why_not(c, total) or "") for c in configs}
    start = time.monotonic()
    done, left = _run_all(run_order([c for c in configs if not rows[c].note]), backends,
                          device, total, args, logs)
    for row in done:
        rows[row.config] = row
    for config in left:
        rows[config].note = f"not run: past --deadline-s {args.deadline_s:.0f}"
    print(f"\nsmoke, {device}, {time.monotonic() - start:.0f} s")
    return _report(rows, logs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
