"""Time to ready against the floor, every figure from a fresh process:

    python bench/start.py time-to-ready --write-checkpoint llama-3.2-1b --model-dir /tmp/ckpt-1b \
        --attention-backend triton --runs 3            (on the GPU machine, repo root)
    python bench/start.py time-to-ready --model-dir /tmp/ckpt-1b --load-only   (weights only)

The floor: a bare CUDA init (`import torch; torch.zeros(1, device=...)`, process wall) and a
bare `safetensors.torch.load_file(..., device=...)` of the same checkpoint (page cache warm).
Then `warmgate-server` from process start to health SERVING with an empty --cache-dir and
empty compiler caches (cold, once), then on the filled one (warm, --runs times). Prints each
figure, ready_over_floor = warm ready / (CUDA init + bare load), warm_over_cold, and
cold_over_longest_compile = the cold warmup / its longest single compile, then the warm start-up
breakdown from the server's log, and a last `json:` line with everything. The CUDA init is
noisy (3.9-5.2 s on one H200): it runs --runs times too, each run printed, the median kept.
The floor runs are not done first: each warm start comes right after a CUDA init and a bare
load of its own, so the host's drift falls on both sides of the ratio, and
ready_over_floor_runs gives each round's own ratio beside the ratio of the medians.

First it byte-compiles what the processes import (compileall over the PYTHONPATH entries, i.e.
the repository's client/ and server/ and any --target directory, and the site-packages
torch is in), as a pod image holds .pyc files: a Python that has none (a read-only venv, or
PYTHONDONTWRITEBYTECODE with packages installed --no-compile) compiles every module from
source at every start, seconds that both the floor and the server pay and no pod does. With
--bytecode-dir, or where one of those directories is not writable, the .pyc go under a
directory of their own instead, named to every process by PYTHONPYCACHEPREFIX (then the
standard library is compiled there too, since Python reads only that tree).
`--no-compile-bytecode` skips the step. --load-only compares the bare load with warmgate's
weight loader in GB/s, page cache warm and (--cold-page-cache, which evicts the files with
posix_fadvise) cold. `--device cpu` runs it all on the CPU (CI);
there `load_file` only maps the file (no byte is read until used), so the CPU figures test the
bench, they measure nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ready_probe import run_to_ready

from warmgate.server.devtools.ready_log import ReadyRun

ROOT = Path(__file__).resolve().parents[2]
ENV = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "client"), str(ROOT / "server"),
                                                   os.environ.get("PYTHONPATH")])),
       "PYTHONUNBUFFERED": "1"}
# Set, these would be respected instead of --cache-dir's entry (and a cold run not be cold).
COMPILER_CACHE_ENV = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE")

CUDA_INIT = """
import sys, torch
torch.zeros(1, device=sys.argv[1])
"""
BARE_LOAD = """
import json, sys, time, torch
from safetensors.torch import load_file
dev, files = sys.argv[1], sys.argv[2:]
torch.zeros(1, device=dev)
sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
sync(); t = time.perf_counter(); n = 0
for f in files:
    n += sum(v.numel() * v.element_size() for v in load_file(f, device=dev).values())
sync(); print(json.dumps({"seconds": time.perf_counter() - t, "bytes": n}))
"""
WARMGATE_LOAD = """
import json, sys, time, torch
from warmgate.server.config.hf_config import model_config_from_hf
from warmgate.server.runner.model import LlamaModel
from warmgate.server.runner.ops import TorchOps
from warmgate.server.runner.weights import load_weights
dev, directory, dtype = torch.device(sys.argv[1]), sys.argv[2], getattr(torch, sys.argv[3])
torch.zeros(1, device=dev)
model = LlamaModel(model_config_from_hf(directory), TorchOps(), None, dev, dtype)
sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
sync(); t = time.perf_counter(); n = load_weights(directory, model)
sync(); print(json.dumps({"seconds": time.perf_counter() - t, "bytes": n}))
"""

# Byte-compile the directories the measured processes import from (run with their
# environment: PYTHONPATH and, in prefix mode, PYTHONPYCACHEPREFIX set).
BYTECODE_DIRS = """
import importlib.util, json, os, site, sysconfig
paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
# The directory torch is installed in (a venv's site-packages or a --target one), unimported.
paths.append(os.path.dirname(os.path.dirname(importlib.util.find_spec("torch").origin)))
paths += site.getsitepackages()
seen, dirs = set(), []
for p in paths:
    p = os.path.realpath(p)
    if os.path.isdir(p) and p not in seen:
        seen.add(p)
        dirs.append(p)
print(json.dumps({"dirs": dirs, "stdlib": os.path.realpath(sysconfig.get_paths()["stdlib"]),
                  "writable": all(os.access(d, os.W_OK) for d in dirs)}))
"""
# compileall.compile_dir(workers=0) sends the pool one file per task: 11 s on 2 cores to find
# a site-packages of 19,000 files already compiled (1.7 s in one process). The same files (its
# walk: no __pycache__, no linked directory) go to compile_file in chunks instead.
BYTECODE_COMPILE = """
import compileall, json, os, re, sys, time
from concurrent.futures import ProcessPoolExecutor
from functools import partial
stdlib, dirs = sys.argv[1], sys.argv[2:]

def sources(top):
    for root, subdirs, names in os.walk(top):
        subdirs[:] = [d for d in subdirs if d != "__pycache__"]
        yield from (os.path.join(root, name) for name in names if name.endswith(".py"))

t, ok = time.perf_counter(), True
with ProcessPoolExecutor() as pool:
    for d in dirs:
        # The standard library's tree may hold site-packages (a pyenv Python): compiled on
        # its own.
        rx = re.compile(r"[/\\\\](site|dist)-packages[/\\\\]") if d == stdlib else None
        # Every result read (all() stopping at the first False would cancel the rest).
        done = list(pool.map(partial(compileall.compile_file, quiet=2, rx=rx), sources(d),
                             chunksize=64))
        ok = all(done) and ok
print(json.dumps({"seconds": time.perf_counter() - t, "all_compiled": ok}))
"""

WRITE_CHECKPOINT = """
import json, sys
from pathlib import Path
from warmgate.server.devtools.checkpoint import write_checkpoint
preset, directory, device, dtype = sys.argv[1:]
print(json.dumps({"done": write_checkpoint(preset, Path(directory), device, dtype)}))
"""


def _python(code: str, *args: str) -> tuple[float, dict[str, Any]]:
    """Run code in a fresh interpreter: (process wall seconds, its last stdout line as JSON)."""
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code, *args], env={**os.environ, **ENV},
                         capture_output=True, text=True, check=False)
    wall = time.monotonic() - start
    if out.returncode != 0:
        raise RuntimeError(f"{code.strip().splitlines()[0]}... failed:\n{out.stderr[-3000:]}")
    lines = out.stdout.strip().splitlines()
    return wall, json.loads(lines[-1]) if lines else {}


def compile_bytecode(bytecode_dir: Path | None) -> dict[str, Any]:
    """Byte-compile what the measured processes import (module docstring): in place, or
    under `bytecode_dir` (given, or a directory is not writable), which adds
    PYTHONPYCACHEPREFIX to ENV, the environment of every process this bench starts."""
    found = _python(BYTECODE_DIRS)[1]
    dirs: list[str] = found["dirs"]
    if bytecode_dir is None and found["writable"]:
        where = "in place"
    else:
        why = "--bytecode-dir" if bytecode_dir else "a directory is not writable"
        bytecode_dir = bytecode_dir or Path(tempfile.gettempdir()) / "warmgate-pycache"
        ENV["PYTHONPYCACHEPREFIX"] = str(bytecode_dir)
        dirs = [found["stdlib"], *dirs]
        where = f"under {bytecode_dir} (PYTHONPYCACHEPREFIX: {why})"
    wall, result = _python(BYTECODE_COMPILE, found["stdlib"], *dirs)
    failed = "" if result["all_compiled"] else " (some files did not compile: test data...)"
    print(f"bytecode: compiled {len(dirs)} directories {where} in {wall:.1f} s{failed}: "
          f"{', '.join(dirs)}", flush=True)
    return {"seconds": wall, "where": where, "dirs": dirs}


def weight_files(model_dir: Path) -> list[str]:
    files = sorted(str(p) for p in model_dir.glob("*.safetensors"))
    if not files:
        raise SystemExit(f"--model-dir {model_dir}: no *.safetensors (pass --write-checkpoint)")
    return files


def set_page_cache(files: list[str], *, warm: bool) -> None:
    """Warm: read every byte once. Cold: tell the kernel to drop the files' clean pages."""
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            if warm:
                while os.read(fd, 64 * 2**20):
                    pass
            else:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _median(values: list[float]) -> float:
    return statistics.median(values)


def measure_load(args: argparse.Namespace, files: list[str], *, warm: bool) -> dict[str, float]:
    """Bare safetensors vs warmgate's loader, --runs each, fresh processes, CUDA init excluded."""
    out: dict[str, list[float]] = {"bare_s": [], "warmgate_s": []}
    size = 0
    for _ in range(args.runs):
        for key, code, extra in (("bare_s", BARE_LOAD, files),
                                 ("warmgate_s", WARMGATE_LOAD,
                                  [str(args.model_dir), args.dtype])):
            set_page_cache(files, warm=warm)
            _, result = _python(code, args.device, *extra)
            out[key].append(result["seconds"])
            size = result["bytes"]
    bare, ours = _median(out["bare_s"]), _median(out["warmgate_s"])
    return {"bytes": size, "bare_s": bare, "warmgate_s": ours, "bare_gb_per_s": size / 1e9 / bare,
            "warmgate_gb_per_s": size / 1e9 / ours, "warmgate_over_bare_speed": bare / ours}


def server_argv(args: argparse.Namespace, cache_dir: str, *, debug: bool) -> list[str]:
    return ["--model", str(args.model_dir), "--device", args.device, "--dtype", args.dtype,
            "--attention-backend", args.attention_backend,
            "--health-port", "0", "--metrics-port", "-1",
            "--cache-dir", cache_dir, "--max-num-seqs", str(args.max_num_seqs),
            "--max-num-batched-tokens", str(args.max_num_batched_tokens),
            "--log-level", "DEBUG" if debug else "INFO", *args.server_flag]


def _save_log(args: argparse.Namespace, name: str, run: ReadyRun) -> None:
    """With --log-dir: the run's stamped log lines, for a look at where its seconds went."""
    if args.log_dir is not None:
        args.log_dir.mkdir(parents=True, exist_ok=True)
        (args.log_dir / f"{name}.log").write_text(
            "".join(f"{at:8.3f} {line}\n" for at, line in run.lines))


def floor_run(args: argparse.Namespace, files: list[str], i: int) -> tuple[float, float]:
    """One CUDA init and one bare load, fresh processes (each printed); their seconds."""
    init = _python(CUDA_INIT, args.device)[0]
    print(f"floor run {i + 1}/{args.runs}: CUDA init {init:.3f} s", flush=True)
    load = float(_python(BARE_LOAD, args.device, *files)[1]["seconds"])
    print(f"floor run {i + 1}/{args.runs}: bare load {load:.3f} s", flush=True)
    return init, load


def measure_ready(args: argparse.Namespace, files: list[str]) -> dict[str, Any]:
    """The cold start, then --runs rounds of (CUDA init, bare load, warm start): each warm start
    right after its own floor runs, so a drift in the host's speed lands on both sides of the
    ratio (one H200 host spread the warm starts of one command by 1.3 s)."""
    env = {k: v for k, v in os.environ.items() if k not in COMPILER_CACHE_ENV} | ENV
    set_page_cache(files, warm=True)
    inits: list[float] = []
    loads: list[float] = []
    with contextlib.ExitStack() as stack:
        cache_dir = (str(args.keep_cache_dir) if args.keep_cache_dir is not None else
                     stack.enter_context(tempfile.TemporaryDirectory(
                         prefix="warmgate-ready-cache.")))
        # The cold run logs at DEBUG: the JIT events, with each compile's seconds, are there.
        cold = run_to_ready(server_argv(args, cache_dir, debug=True), env, args.timeout)
        _save_log(args, "cold", cold)
        warm: list[ReadyRun] = []
        for i in range(args.runs):
            init, load = floor_run(args, files, i)
            inits.append(init)
            loads.append(load)
            warm.append(run_to_ready(server_argv(args, cache_dir, debug=False), env,
                                     args.timeout))
            _save_log(args, f"warm-{i + 1}", warm[-1])
            print(f"warm run {i + 1}/{args.runs}: ready in {warm[-1].ready_s:.3f} s, "
                  f"{warm[-1].ready_s / (init + load):.3f}x its floor", flush=True)
    floor = _median(inits) + _median(loads)
    warm_ready = _median([r.ready_s for r in warm])
    median_run = min(warm, key=lambda r: abs(r.ready_s - warm_ready))
    longest = cold.longest_compile_s()
    cold_warmup = cold.breakdown()["warmup_total_s"]
    return {"cuda_init_s": _median(inits), "bare_load_s": _median(loads), "floor_s": floor,
            "cuda_init_runs_s": inits, "bare_load_runs_s": loads,
            "ready_over_floor": warm_ready / floor,
            "ready_over_floor_runs": [r.ready_s / (i + b)
                                      for r, i, b in zip(warm, inits, loads, strict=True)],
            "cold_ready_s": cold.ready_s, "warm_ready_s": warm_ready,
            "warm_ready_runs_s": [r.ready_s for r in warm],
            "warm_over_cold": warm_ready / cold.ready_s,
            "cold_warmup_s": cold_warmup, "cold_longest_compile_s": longest,
            "cold_over_longest_compile": (cold_warmup / longest
                                          if longest and cold_warmup is not None else None),
            "warm_breakdown": median_run.breakdown(), "cold_breakdown": cold.breakdown()}


def _print(figures: dict[str, Any], prefix: str = "") -> None:
    for key, value in figures.items():
        if isinstance(value, dict):
            _print(value, f"{prefix}{key}.")
        elif isinstance(value, float):
            print(f"{prefix}{key}: {value:.3f}")
        else:
            print(f"{prefix}{key}: {'n/a' if value is None else value}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", type=Path, required=True, help="safetensors checkpoint dir")
    p.add_argument("--write-checkpoint", metavar="PRESET", help="write PRESET's shapes with "
                   "random weights into --model-dir first (kept if already there)")
    p.add_argument("--preset", help="the preset --model-dir holds (label for the output)")
    p.add_argument("--attention-backend", default="triton", help="triton, flashinfer or torch")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--runs", type=int, default=3, help="runs of each warm figure (median)")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per server start")
    p.add_argument("--load-only", action="store_true", help="only bare vs warmgate weight load")
    p.add_argument("--cold-page-cache", action="store_true",
                   help="with --load-only: also measure with the files evicted from page cache")
    p.add_argument("--no-compile-bytecode", dest="compile_bytecode", action="store_false",
                   help="skip byte-compiling what the processes import (measure a Python "
                   "that may compile every module from source at every start)")
    p.add_argument("--bytecode-dir", type=Path, help="put every .pyc here (PYTHONPYCACHEPREFIX "
                   "for every process) instead of beside its source; the default where a "
                   "directory to compile is not writable: $TMPDIR/warmgate-pycache")
    p.add_argument("--keep-cache-dir", type=Path, help="fill this (new or empty) directory as "
                   "the servers' --cache-dir instead of a temporary one, and leave it")
    p.add_argument("--log-dir", type=Path, help="write each server's stamped log here "
                   "(cold.log, warm-N.log)")
    p.add_argument("--server-flag", action="append", default=[],
                   help="extra warmgate-server flag (repeat), e.g. --server-flag=--compile=true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.keep_cache_dir is not None and args.keep_cache_dir.exists() and any(
            args.keep_cache_dir.iterdir()):
        print(f"--keep-cache-dir {args.keep_cache_dir}: not empty (the cold run needs an "
              "empty cache)", file=sys.stderr)
        return 2
    figures: dict[str, Any] = {"preset": args.write_checkpoint or args.preset,
                               "device": args.device, "attention_backend": args.attention_backend,
                               "model_dir": str(args.model_dir)}
    if args.write_checkpoint:
        # In its own process: this one must hold no GPU memory while the servers size their
        # KV caches from what is free.
        figures["checkpoint"] = _python(WRITE_CHECKPOINT, args.write_checkpoint,
                                        str(args.model_dir), args.device, args.dtype)[1]["done"]
    files = weight_files(args.model_dir)
    figures["bytecode"] = (compile_bytecode(args.bytecode_dir) if args.compile_bytecode
                           else "not compiled (--no-compile-bytecode)")
    if not args.compile_bytecode:
        print("bytecode: not compiled (--no-compile-bytecode)", flush=True)
    if args.load_only:
        figures["load_page_cache_warm"] = measure_load(args, files, warm=True)
        if args.cold_page_cache:
            figures["load_page_cache_cold"] = measure_load(args, files, warm=False)
    else:
        figures.update(measure_ready(args, files))
    _print(figures)
    print("json: " + json.dumps(figures, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
