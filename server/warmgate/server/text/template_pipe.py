"""One chat template worker process (text.template_worker) and its pipes, for
text.template_process: start it, send a request, read the answer within a deadline, kill it.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from typing import IO, Any

from warmgate.server.text.template_worker import HEADER, encode_message

# Starting an interpreter and importing jinja2: not the template's time, so not its bound;
# generous for a loaded machine.
STARTUP_TIMEOUT_S = 30.0
_READ_CHUNK = 1 << 16
# How often a render waiting for its worker's answer (or for a worker) looks whether its
# request was cancelled.
CANCEL_POLL_S = 0.02


class WorkerTimeout(Exception):
    """No (whole) answer within the deadline."""


class WorkerDied(Exception):
    """The process exited or closed its pipe; the message says how."""


class WorkerCancelled(Exception):
    """The request was cancelled while the worker worked on it."""


class TemplateWorker:
    """One worker process and its pipes."""

    def __init__(self, memory_mib: int, timeout_s: float) -> None:
        # -I would drop PYTHONPATH, which a checkout run without installing needs.
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "warmgate.server.text.template_worker",
             str(memory_mib << 20), str(timeout_s)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            close_fds=True)
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._stdin: IO[bytes] = self._proc.stdin
        self._stdout_fd = self._proc.stdout.fileno()
        self.pid = self._proc.pid
        self._killed = False
        try:
            self._read(STARTUP_TIMEOUT_S)
        except BaseException:
            self.kill()
            raise

    def call(self, request: dict[str, Any], timeout_s: float,
             cancelled: threading.Event | None = None) -> dict[str, Any]:
        try:
            self._stdin.write(encode_message(request))
            self._stdin.flush()
        except OSError as exc:
            raise WorkerDied(f"its pipe closed ({exc})") from None
        return self._read(timeout_s, cancelled)

    def _read(self, timeout_s: float, cancelled: threading.Event | None = None
              ) -> dict[str, Any]:
        """The next message; WorkerTimeout past timeout_s, WorkerCancelled once `cancelled`
        is set (the answer then still comes, so the caller must not use this worker again)."""
        deadline = time.monotonic() + timeout_s
        data = bytearray()
        size: int | None = None
        while size is None or len(data) < HEADER.size + size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerTimeout()
            wait = left if cancelled is None else min(left, CANCEL_POLL_S)
            if not select.select([self._stdout_fd], [], [], wait)[0]:
                if cancelled is not None and cancelled.is_set():
                    raise WorkerCancelled()
                continue
            chunk = os.read(self._stdout_fd, _READ_CHUNK)
            if not chunk:
                code = self._proc.poll()
                raise WorkerDied(f"it exited (code {code})" if code is not None else "it closed")
            data += chunk
            if size is None and len(data) >= HEADER.size:
                (size,) = HEADER.unpack(data[:HEADER.size])
        message: dict[str, Any] = json.loads(bytes(data[HEADER.size:]).decode(
            "utf-8", "surrogatepass"))
        return message

    @property
    def alive(self) -> bool:
        return not self._killed and self._proc.poll() is None

    def kill(self) -> None:
        self._killed = True
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        self._stdin.close()
        if self._proc.stdout is not None:
            self._proc.stdout.close()


def close_all(workers: list[TemplateWorker]) -> None:
    for worker in list(workers):
        worker.kill()
