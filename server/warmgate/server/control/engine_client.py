"""The front's side of the engine process: start it, send it commands, read what it sends.

The engine (`python -m warmgate.server.engine_main`) is started like a tensor-parallel
worker (distributed/workers.py): its stdin is the command channel, a second pipe
(`--reply-fd`) carries everything back, stdout and stderr are the server's. One receiver
thread reads that pipe and hands each message to where it goes: the reply and progress of
the job in flight to the waiting worker thread, a step's events to the serving loop's sink
(one call per step), statistics to the metrics, JIT events to the front's monitor, the cache
entry's state to a field GetStatus reads without asking the engine. A watchdog polls the
process; its exit (kill -9 included) or the pipe's end of file while the server needs it is
reported once to `on_lost`, and every waiter is woken with the loss.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from warmgate.server.config.server_config import ServerConfig
from warmgate.server.control import engine_wire as wire
from warmgate.server.core.errors import ShuttingDown
from warmgate.server.core.failures import FatalDeviceError
from warmgate.server.distributed.channel import encode, receive, send_encoded
from warmgate.server.text.model_text import ModelText

logger = logging.getLogger(__name__)

WATCHDOG_POLL_S = 0.5
# The engine exits at its end of file at once (its reader thread does nothing else, builds
# and steps run elsewhere); this bounds one that does not, within the 2 s a stop may take
# past its grace.
STOP_WAIT_S = 1.0
Handler = Callable[[Any], None]


class EngineLost(RuntimeError):
    """The engine process exited, or was killed for hanging, while the server needed it."""


def engine_text(text: ModelText) -> ModelText:
    """What the engine gets of the model's text files as the front loaded them at start-up:
    the tokenizer (the grammars' vocabulary) and EOS ids. The chat template (and its worker
    processes) stays in the front, which renders the prompts."""
    tokenizer = text.tokenizer
    if tokenizer is not None and tokenizer.chat_template is not None:
        tokenizer = copy.copy(tokenizer)
        tokenizer.chat_template = None
    return dataclasses.replace(text, tokenizer=tokenizer)


class EngineProcess:
    def __init__(self, config: ServerConfig, text: ModelText | None = None) -> None:
        self._config = config
        self._text = engine_text(text if text is not None else ModelText())
        # The job in flight (load, a plan, a serving run) reads its messages here.
        self.jobs: queue.Queue[tuple[Any, ...]] = queue.Queue()
        # Set by the owners (RemoteEngine, RemoteServingLoop, app.py) before the first job.
        self.handlers: dict[str, Handler] = {}
        self.on_lost: Callable[[FatalDeviceError], None] | None = None
        self.cache_info: dict[str, Any] | None = None
        # perf_counter of the last message: a serving run that hears nothing is hung.
        self.last_heard = time.perf_counter()
        self._send_lock = threading.Lock()
        self._closed = threading.Event()
        self._lost: EngineLost | None = None
        self._lost_lock = threading.Lock()

    def launch(self) -> None:
        """Start the engine (once the server has bound its port: a start-up error must stay
        the last line of the log)."""
        read_fd, write_fd = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "warmgate.server.engine_main",
                 "--reply-fd", str(write_fd)], stdin=subprocess.PIPE, pass_fds=(write_fd,))
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)  # the engine holds it now: its exit is our end of file
        logger.info("engine process started (pid %d): runner, warmup and serving loop run "
                    "there", self.proc.pid)
        self._replies = os.fdopen(read_fd, "rb")
        self._send(encode(self._config))
        self._send(encode(self._text))
        self._reader = threading.Thread(target=self._read, name="engine-replies", daemon=True)
        self._reader.start()
        self._watchdog = threading.Thread(target=self._watch, name="engine-watchdog",
                                          daemon=True)
        self._watchdog.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def lost(self) -> EngineLost | None:
        return self._lost

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    # -- commands -----------------------------------------------------------------------

    def send(self, *message: Any) -> None:
        """One command; raises the loss if the engine is gone."""
        if self._lost is not None:
            raise self._lost
        self._send(encode(message))

    def _send(self, data: bytes) -> None:
        assert self.proc.stdin is not None  # opened with stdin=PIPE
        try:
            with self._send_lock:
                send_encoded(self.proc.stdin, data)
        except (BrokenPipeError, ValueError, OSError) as exc:
            raise self._mark_lost(f"the engine process (pid {self.proc.pid}) is gone (exit "
                                  f"code {self.proc.poll()})") from exc

    def next_job_message(self, timeout: float | None) -> tuple[Any, ...] | None:
        """The job in flight's next message (None after `timeout` s without one); raises the
        loss once the engine is gone."""
        try:
            message = self.jobs.get(timeout=timeout)
        except queue.Empty:
            return None
        if message[0] == wire.LOST:
            self.jobs.put(message)  # for the next waiter too
            raise message[1]
        return message

    # -- the receiver -------------------------------------------------------------------

    def _read(self) -> None:
        with self._replies:
            while True:
                try:
                    message = receive(self._replies)
                except Exception:  # a torn message from a dying engine: the loss follows
                    logger.exception("unreadable message from the engine process")
                    message = None
                if message is None:
                    break
                self.last_heard = time.perf_counter()
                kind = message[0]
                handler = self.handlers.get(kind)
                if handler is not None:
                    try:
                        handler(message[1])
                    except Exception:  # a handler's bug must not stop the receiver
                        logger.exception("handling the engine's %r message failed", kind)
                elif kind == wire.CACHE_INFO:
                    self.cache_info = message[1]
                elif kind == wire.LOST:
                    self._report(FatalDeviceError("distributed",
                                                  wire.error_of_wire(message[1])))
                else:  # DONE, FAILED, PROGRESS: the job in flight's
                    self.jobs.put(message)
        if not self._closed.is_set():
            self._mark_lost(f"the engine process (pid {self.proc.pid}) closed its pipe")

    def _watch(self) -> None:
        while not self._closed.wait(WATCHDOG_POLL_S):
            code = self.proc.poll()
            if code is not None and not self._closed.is_set():
                self._mark_lost(f"the engine process (pid {self.proc.pid}) exited with code "
                                f"{code}")
                return

    def _mark_lost(self, reason: str) -> EngineLost:
        with self._lost_lock:
            if self._lost is not None:
                return self._lost
            self._lost = EngineLost(reason)
        if self._closed.is_set():
            return self._lost
        logger.critical("%s: the model cannot run without it", reason)
        self.jobs.put((wire.LOST, FatalDeviceError("engine", self._lost)))
        self._report(FatalDeviceError("engine", self._lost))
        return self._lost

    def _report(self, error: FatalDeviceError) -> None:
        if self.on_lost is not None and not self._closed.is_set():
            self.on_lost(error)

    def kill(self, reason: str) -> None:
        """A hung engine: SIGKILL, then the loss is reported as for a crash."""
        logger.critical("killing the engine process (pid %d): %s", self.proc.pid, reason)
        with contextlib.suppress(OSError):
            self.proc.kill()
        self._mark_lost(reason)

    def close(self) -> None:
        """Stop the engine: end of file first (it exits, closing its tensor-parallel
        workers), SIGKILL if it is still there after STOP_WAIT_S."""
        if self._closed.is_set():
            return
        self._closed.set()
        self.jobs.put((wire.LOST, ShuttingDown()))
        if not hasattr(self, "proc"):  # never launched: the server did not start
            return  # a waiter's job ends as a stop, not a loss
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            logger.warning("the engine process (pid %d) did not stop; killing it",
                           self.proc.pid)
            self.proc.kill()
            self.proc.wait()
        logger.info("engine process %d stopped (exit code %s)", self.proc.pid,
                    self.proc.returncode)
        self._reader.join(STOP_WAIT_S)
