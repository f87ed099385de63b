"""`warmgate-server` in a subprocess on loopback, with its ports read from its log."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 60.0
MAIN_PORT = re.compile(r"serving warmgate\.v1\.Warmup on 127\.0\.0\.1:(\d+)")
HEALTH_PORT = re.compile(r"serving grpc\.health\.v1 \(plaintext\) on 127\.0\.0\.1:(\d+)")


class ServerProcess:
    """Start with `with ServerProcess(flags, env) as p:`; p.port, p.health_port, p.log()."""

    def __init__(self, flags: Sequence[str] = (), env: Mapping[str, str] | None = None) -> None:
        self._argv = [sys.executable, "-m", "warmgate.server.main", "--host", "127.0.0.1",
                      "--port", "0", "--device", "cpu", *flags]
        self._env = {**os.environ,
                     "PYTHONPATH": os.pathsep.join([str(ROOT / "client"), str(ROOT / "server")]),
                     "WARMGATE_METRICS_PORT": "-1", **(env or {})}
        self._lines: list[str] = []
        self._seen = threading.Condition()
        self.port = 0
        self.health_port = 0

    def __enter__(self) -> ServerProcess:
        self.proc = subprocess.Popen(self._argv, env=self._env, stderr=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, text=True)
        # A reader thread, so a chatty server never blocks on a full pipe.
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.port = int(self.wait_for(MAIN_PORT).group(1))
        if "--health-port" in self._argv:
            self.health_port = int(self.wait_for(HEALTH_PORT).group(1))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        self._reader.join(10)

    def _read(self) -> None:
        assert self.proc.stderr is not None  # Popen with stderr=PIPE always has one
        for line in self.proc.stderr:
            with self._seen:
                self._lines.append(line)
                self._seen.notify_all()
        with self._seen:
            self._seen.notify_all()

    def log(self) -> str:
        with self._seen:
            return "".join(self._lines)

    def wait_for(self, pattern: re.Pattern[str], timeout: float = START_TIMEOUT_S
                 ) -> re.Match[str]:
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
