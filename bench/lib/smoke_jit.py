"""The smoke's FlashInfer JIT, built once per module set before any FlashInfer server starts.

A server's only FlashInfer JIT is its warmup's "flashinfer JIT" phase, and what it builds
depends on three things alone: the head size, the model's dtype (queries and KV cache alike)
and whether decode takes the tensor-core kernel (a module of its own). Servers of one key that
start together each build the same modules again (90-110 s of nvcc on an H100 host, with the
server's weights already on the card), so the smoke builds each key once, all keys at once, in
a process of its own into the shared cache (FLASHINFER_WORKSPACE_BASE), and starts a key's
servers once its build has ended:

    python bench/lib/smoke_jit.py --head-dim 128 --tensor-cores 1 --dtype bfloat16

runs the server's own backend (FlashInferAttentionBackend(spec).jit_warmup()) for the
smallest spec of that key.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from smoke_plan import BLOCK_SIZE, SmokeConfig
from smoke_quiet import SessionPause, signal_session

from warmgate.server.config.attention_backends import head_dim_problem
from warmgate.server.config.runner_config import resolve_runner_config
from warmgate.server.runner.attention.base import AttentionSpec
from warmgate.server.runner.attention.flashinfer_backend import (
    FlashInferAttentionBackend,
    tensor_core_decode,
)

# Device memory a build holds (a scratch cache of two blocks and two 256 MiB workspaces, the
# CUDA context): counted in the smoke's memory budget while it runs.
PREBUILD_BYTES = 2**30
DTYPES = ("bfloat16", "float16", "float32")
TAIL = 5  # output lines a failed build's rows quote


@dataclass(frozen=True, order=True)
class JitKey:
    head_dim: int
    dtype: str  # a torch dtype's name
    tensor_cores: bool

    @property
    def name(self) -> str:
        return (f"head {self.head_dim} {self.dtype} "
                f"{'tensor-core' if self.tensor_cores else 'plain'} decode")

    @property
    def stem(self) -> str:  # its log file's name
        return f"jit-{self.head_dim}-{self.dtype}-{'tc' if self.tensor_cores else 'plain'}"

    def argv(self, device: str) -> list[str]:
        """The command that builds this key's modules on `device`."""
        return [sys.executable, str(Path(__file__).resolve()), "--head-dim", str(self.head_dim),
                "--tensor-cores", str(int(self.tensor_cores)), "--dtype", self.dtype,
                "--device", device]


def jit_key(config: SmokeConfig, device: str = "cuda",
            cuda_capability: tuple[int, int] | None = None) -> JitKey | None:
    """The modules a server of this configuration builds in its FlashInfer JIT phase (None for
    the other backends): read from the configuration the server itself resolves from the
    smoke's flags, as if on `device` (the capability, when given, stands for the card's)."""
    if config.backend != "flashinfer":
        return None
    from warmgate.server.startup import load_server_config

    runner = load_server_config(shlex.split(config.server_args(device)), environ={},
                                resolve=False).runner
    runner = resolve_runner_config(runner, cuda_available=device.startswith("cuda"),
                                   cuda_capability=cuda_capability)
    model, tp = runner.model, runner.parallel.tensor_parallel_size
    return JitKey(model.head_dim, runner.device.dtype,
                  tensor_core_decode(model.num_heads // tp, model.num_kv_heads // tp))


def minimal_spec(key: JitKey, device: str) -> AttentionSpec:
    """The smallest AttentionSpec whose backend builds this key's modules."""
    # One KV head; four query heads share it for the tensor-core decode, one does not.
    heads = 4 if key.tensor_cores else 1
    return AttentionSpec(num_heads=heads, num_kv_heads=1, head_dim=key.head_dim,
                         block_size=BLOCK_SIZE, num_blocks=2, max_blocks_per_req=1,
                         max_num_reqs=1, max_num_tokens=2, dtype=getattr(torch, key.dtype),
                         device=torch.device(device))


class Prebuild:
    """One key's build: its entry above in a session of its own, output to `log`."""

    def __init__(self, key: JitKey, device: str, log: Path) -> None:
        self.key = key
        self.log = log
        self.started = time.monotonic()
        self.seconds = 0.0
        self.exit_code: int | None = None
        self.note = ""
        with log.open("w") as out:
            self.proc = subprocess.Popen(key.argv(device), stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self._pause = SessionPause(self.proc.pid)  # its session: ninja's nvcc jobs too

    def pause(self) -> None:
        self._pause.pause()

    def resume(self) -> None:
        self._pause.resume()

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def poll(self, timeout_s: float) -> bool:
        """Whether the build has ended (killed now if past its time)."""
        if self.exit_code is not None:
            return True
        if self.proc.poll() is None:
            # Its time runs only while it may build: a quiet window's stop is not its own.
            if time.monotonic() - self.started - self._pause.stopped_s() < timeout_s:
                return False
            self.kill()
            self.note = f"timed out after {timeout_s:.0f} s"
        self.seconds = time.monotonic() - self.started
        self.exit_code = self.proc.returncode
        if not self.ok:
            lines = [ln.strip() for ln in self.log.read_text(errors="replace").splitlines()
                     if ln.strip()]
            tail = " | ".join(line[:200] for line in lines[-TAIL:]) or "no output"
            self.note = "; ".join(filter(None, [
                f"FlashInfer JIT prebuild ({self.key.name}) failed, exit {self.exit_code}",
                self.note, f"{self.log.name}: {tail}"]))
        return True

    def kill(self) -> None:
        signal_session(self.proc.pid, signal.SIGKILL)  # ninja's compile jobs too
        self.proc.wait()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--head-dim", type=int, required=True)
    p.add_argument("--tensor-cores", type=int, choices=(0, 1), required=True,
                   help="1: the tensor-core decode module (4 or more query heads a KV head)")
    p.add_argument("--dtype", choices=DTYPES, required=True, help="queries and KV cache")
    p.add_argument("--device", default="cuda")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if (problem := head_dim_problem("flashinfer", args.head_dim)) is not None:
        parser.error(f"--head-dim {args.head_dim}: {problem}")
    if not args.device.startswith("cuda"):
        parser.error(f"--device {args.device}: FlashInfer builds its modules for a CUDA device")
    key = JitKey(args.head_dim, args.dtype, bool(args.tensor_cores))
    start = time.monotonic()
    backend = FlashInferAttentionBackend(minimal_spec(key, args.device))
    if backend.use_tensor_cores != key.tensor_cores:  # the spec above no longer picks the key
        raise SystemExit(f"the spec for {key.name} built tensor-core decode="
                         f"{backend.use_tensor_cores}")
    info = backend.jit_warmup()
    print(f"built {key.name} in {time.monotonic() - start:.1f} s: {info}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
