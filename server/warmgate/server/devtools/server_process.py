"""`warmgate-server` in a subprocess on loopback, with its ports read from its log: the one
harness the process tests and the benchmarks that need a real server process share."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

MAIN_PORT = re.compile(r"serving warmgate\.v1\.Warmup on 127\.0\.0\.1:(\d+)")
HEALTH_PORT = re.compile(r"serving grpc\.health\.v1 \(plaintext\) on 127\.0\.0\.1:(\d+)")
HEALTH_PID = re.compile(r"warmgate health process (\d+): serving")
# Where the compilers keep their on-disk caches; fresh_caches points each at an empty folder.
CACHE_ENV_VARS = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE")


def source_roots() -> list[str]:
    """The folders this process imports warmgate's client and server from, so the child runs
    the same code (a source checkout beside another installed warmgate included)."""
    roots = []
    for name in ("warmgate.client", "warmgate.server"):
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError(f"{name} is not importable; install warmgate[server]")
        roots.append(str(Path(next(iter(spec.submodule_search_locations))).parents[1]))
    return roots


class ServerProcess:
    """`with ServerProcess(flags, env) as p:` starts the server (`--port 0`, metrics off, on
    the CPU unless `device` says otherwise, flags after) and waits for its port; p.port,
    p.target, p.health_port (with --health-port), p.log(). On exit the process gets
    `stop_signal` (SIGKILL by default; SIGTERM lets it drain), then SIGKILL if it lingers.
    Each log line keeps the seconds since the start that it arrived at (`timeline`), which
    is what the time-to-ready bench reads its start-up breakdown from. `inherit_env=False`
    starts the server with exactly `env` (the bench's cold runs must not inherit compiler
    cache variables). `wait_for_main=False` returns once the health port (the health
    process's, up before the model server) answers, with p.port still 0. `roots` are the
    folders the child imports warmgate's client and server from, ahead of env's PYTHONPATH
    (default: this process's, source_roots())."""

    def __init__(self, flags: Sequence[str] = (), env: Mapping[str, str] | None = None, *,
                 device: str | None = "cpu", start_timeout_s: float = 60.0,
                 stop_signal: signal.Signals = signal.SIGKILL,
                 fresh_caches: bool = False, inherit_env: bool = True,
                 wait_for_main: bool = True, roots: Sequence[str] | None = None) -> None:
        self.argv = [sys.executable, "-m", "warmgate.server.main", "--host", "127.0.0.1",
                     "--port", "0", *(["--device", device] if device else []), *flags]
        self._env = {**(os.environ if inherit_env else {}), "WARMGATE_METRICS_PORT": "-1",
                     **(env or {})}
        self._env["PYTHONPATH"] = os.pathsep.join(
            [*(source_roots() if roots is None else roots),
             *filter(None, [self._env.get("PYTHONPATH")])])
        self._cache_root: str | None = None
        if fresh_caches:
            self._cache_root = tempfile.mkdtemp(prefix="warmgate-server-caches-")
            for var in CACHE_ENV_VARS:
                self._env[var] = os.path.join(self._cache_root, var.lower())
        self.start_timeout_s = start_timeout_s
        self.wait_for_main = wait_for_main
        self.stop_signal = stop_signal
        self._lines: list[str] = []
        self._stamps: list[float] = []
        self._seen = threading.Condition()
        self.port = 0
        self.health_port = 0
        self.started = 0.0

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> ServerProcess:
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(self.argv, env=self._env, stderr=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, text=True)
        # A reader thread, so a chatty server never blocks on a full pipe.
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        try:
            if "--health-port" in self.argv:
                self.health_port = int(self.wait_for(HEALTH_PORT, self.start_timeout_s)
                                       .group(1))
            if self.wait_for_main:
                self.port = int(self.wait_for(MAIN_PORT, self.start_timeout_s).group(1))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(self.stop_signal)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait(30)
        self._reader.join(10)
        if self._cache_root is not None:
            shutil.rmtree(self._cache_root, ignore_errors=True)

    def _read(self) -> None:
        assert self.proc.stderr is not None  # Popen with stderr=PIPE always has one
        for line in self.proc.stderr:
            with self._seen:
                self._lines.append(line)
                self._stamps.append(time.perf_counter() - self.started)
                self._seen.notify_all()
        with self._seen:
            self._seen.notify_all()

    def log(self) -> str:
        with self._seen:
            return "".join(self._lines)

    def timeline(self) -> list[tuple[float, str]]:
        """Each log line (without its newline) with the seconds since the start it came at."""
        with self._seen:
            return [(at, line.rstrip("\n")) for at, line in zip(self._stamps, self._lines,
                                                                 strict=True)]

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def log_tail(self, lines: int = 40) -> str:
        with self._seen:
            return "".join(self._lines[-lines:])

    def wait_for(self, pattern: re.Pattern[str], timeout: float = 60.0) -> re.Match[str]:
        """The first log line matching `pattern`; fails with the log if none comes in time."""
        deadline = time.monotonic() + timeout
        with self._seen:
            while True:
                for line in self._lines:
                    if (match := pattern.search(line)) is not None:
                        return match
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(f"no {pattern.pattern!r} in the log:\n"
                                         + "".join(self._lines))
                self._seen.wait(min(left, 0.1))

    def wait_exit(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(10)
        return code

    def health_pid(self) -> int:
        """The health process's pid, from its first log line (with --health-port)."""
        return int(self.wait_for(HEALTH_PID).group(1))

    def rss_mib(self) -> float:
        """The server's resident memory (Linux: /proc)."""
        with open(f"/proc/{self.proc.pid}/status") as status:
            kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
        return kib / 1024
