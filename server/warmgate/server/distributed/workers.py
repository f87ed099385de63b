"""Rank 0's side of the worker processes: start them, send them each call, watch them, stop
them.

Workers are plain subprocesses (`python -m warmgate.server.tp_worker`), no
torchrun: their stdin is the step channel (channel.py), a second pipe carries their JIT
events back (replies.py), stdout and stderr are the server's, so their log lines land in the
pod's log. A watchdog thread polls each one; the first that exits while
the group is open is reported to `on_lost` (the server turns that into state FAILED, health
NOT_SERVING and a non-zero exit). Closing the group closes the pipes (each worker reads end
of file and exits), then waits, then kills what is left.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from warmgate.server.config.runner_config import RunnerConfig
from warmgate.server.distributed.channel import encode, send_encoded
from warmgate.server.distributed.replies import ReplyReader

logger = logging.getLogger(__name__)

WATCHDOG_POLL_S = 0.5
STOP_WAIT_S = 5.0


class WorkerLost(RuntimeError):
    """A worker rank exited while the server needed it."""


class WorkerGroup:
    def __init__(self, processes: list[subprocess.Popen[bytes]],
                 replies: ReplyReader | None = None) -> None:
        self.processes = processes
        # Each worker's JIT events; rank 0's runner says where they go (relay_to).
        self.replies = replies if replies is not None else ReplyReader({})
        # Set through watch() by the server (control.engine); called once, from the watchdog
        # thread (or from watch() when a worker was already gone), with a WorkerLost.
        self._on_lost: Callable[[BaseException], None] | None = None
        self._closed = threading.Event()
        self._lost: WorkerLost | None = None
        self._watchdog = threading.Thread(target=self._watch, name="tp-watchdog", daemon=True)
        self._watchdog.start()

    @classmethod
    def start(cls, configs: list[RunnerConfig], store_port: int) -> WorkerGroup:
        """Start one worker per config (ranks 1..N-1) and hand each its config."""
        processes, replies = [], {}
        for config in configs:
            rank = config.parallel.rank
            read_fd, write_fd = os.pipe()
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "warmgate.server.tp_worker",
                     "--rank", str(rank), "--store-port", str(store_port),
                     "--reply-fd", str(write_fd)],
                    stdin=subprocess.PIPE, pass_fds=(write_fd,))
            except BaseException:
                os.close(read_fd)
                raise
            finally:
                os.close(write_fd)  # the worker holds it now: its exit is our end of file
            processes.append(proc)
            replies[rank] = os.fdopen(read_fd, "rb")
            logger.info("tensor parallel: started rank %d/%d (pid %d)", rank,
                        config.parallel.tensor_parallel_size, proc.pid)
        group = cls(processes, ReplyReader(replies))
        for proc, config in zip(processes, configs, strict=True):
            group._write(proc, encode(config))
        return group

    @property
    def lost(self) -> WorkerLost | None:
        return self._lost

    def watch(self, on_lost: Callable[[BaseException], None]) -> None:
        """Call on_lost with a WorkerLost when a worker exits (at once if one already has)."""
        self._on_lost = on_lost
        if self._lost is not None:
            on_lost(self._lost)

    def _write(self, proc: subprocess.Popen[bytes], data: bytes) -> None:
        assert proc.stdin is not None  # opened with stdin=PIPE
        try:
            send_encoded(proc.stdin, data)
        except (BrokenPipeError, ValueError) as exc:
            raise WorkerLost(f"worker pid {proc.pid} is gone (exit code {proc.poll()}): "
                             f"cannot send it the step") from exc

    def send(self, message: Any) -> None:
        """One call to every worker: pickled once, written into each pipe."""
        if self._lost is not None:
            raise self._lost
        data = encode(message)
        for proc in self.processes:
            self._write(proc, data)

    def _watch(self) -> None:
        while not self._closed.wait(WATCHDOG_POLL_S):
            for rank, proc in enumerate(self.processes, start=1):
                code = proc.poll()
                if code is None or self._closed.is_set():
                    continue
                self._lost = WorkerLost(f"tensor-parallel rank {rank} (pid {proc.pid}) exited "
                                        f"with code {code}")
                logger.critical("%s: the model cannot run without it", self._lost)
                if self._on_lost is not None:
                    self._on_lost(self._lost)
                return

    def close(self) -> None:
        """Stop every worker: end of file first, SIGKILL for any still there after
        STOP_WAIT_S."""
        if self._closed.is_set():
            return
        self._closed.set()
        for proc in self.processes:
            if proc.stdin is not None:
                with contextlib.suppress(OSError):  # a dead worker's pipe may be broken
                    proc.stdin.close()
        deadline = time.monotonic() + STOP_WAIT_S
        for proc in self.processes:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("tensor parallel: pid %d did not stop; killing it", proc.pid)
                proc.kill()
                proc.wait()
        self.replies.join(STOP_WAIT_S)
