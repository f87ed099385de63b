"""RemoteEngine: the WarmupEngine of a server whose runner lives in the engine process.

load, run_plan and run_mixed block the front's runner worker on the engine's reply, as
PlanEngine's block it on the runner; progress events come back on the way and reach the
same ProgressCallback on that thread, and a WarmupCancelled it raises (the server stops) is
sent on as a cancel, which the engine's plan raises at its next step.

The JIT monitor here mirrors the engine's: every event the engine's monitor records (its TP
workers' included) is counted here too, so the metrics, --strict-jit and the graph misses
GetStatus reports see them as in one process; marking it ready or not tells the engine's
monitor, ahead of any request that readiness covers (one ordered pipe).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from warmgate.server.config.server_config import ServerConfig
from warmgate.server.control import engine_wire as wire
from warmgate.server.control.engine_client import EngineLost, EngineProcess
from warmgate.server.control.remote_serving import RemoteRunner
from warmgate.server.control.worker import WarmupCancelled
from warmgate.server.core.errors import ShuttingDown
from warmgate.server.core.failures import FatalDeviceError
from warmgate.server.core.progress import ProgressCallback
from warmgate.server.core.results import PhaseResult, WarmupReport
from warmgate.server.jit import JitMonitor
from warmgate.server.jit.events import JitEvent
from warmgate.server.text.model_text import ModelText

logger = logging.getLogger(__name__)


class MirrorJitMonitor(JitMonitor):
    """Counts the engine's events as its own; its readiness goes to the engine."""

    def __init__(self, send_ready: Callable[[bool], None]) -> None:
        super().__init__()
        self._send_ready = send_ready

    def mark_ready(self) -> None:
        super().mark_ready()
        with contextlib.suppress(EngineLost):  # a lost engine takes the server down anyway
            self._send_ready(True)

    def mark_not_ready(self) -> None:
        super().mark_not_ready()
        with contextlib.suppress(EngineLost):
            self._send_ready(False)

    def adopt(self, event: JitEvent) -> None:
        """An event the engine's monitor recorded (after_ready as the engine judged it)."""
        if event.rank != self.rank:  # a TP worker's, relayed by the engine
            self.relay(event)
            return
        with self._lock:
            self._counts.add(event)
        self._notify(event)


class RemoteEngine:
    def __init__(self, process: EngineProcess, step_timeout_s: float) -> None:
        self.process = process
        self.jit_monitor = MirrorJitMonitor(lambda ready: process.send(wire.READY, ready))
        process.handlers[wire.JIT] = self.jit_monitor.adopt
        self._runner = RemoteRunner(process, step_timeout_s)
        self._loaded = False

    @classmethod
    def start(cls, config: ServerConfig, text: ModelText | None = None) -> RemoteEngine:
        """text: the model's text files as loaded at start-up (None: none, as for a model
        without a directory)."""
        return cls(EngineProcess(config, text if text is not None else ModelText()),
                   config.engine_step_timeout_s)

    @property
    def on_fatal(self) -> Callable[[FatalDeviceError], None] | None:
        return self.process.on_lost

    @on_fatal.setter
    def on_fatal(self, fn: Callable[[FatalDeviceError], None] | None) -> None:
        """Told (from the watchdog or receiver thread) when the engine or one of its
        tensor-parallel workers is gone."""
        self.process.on_lost = fn

    @property
    def loaded(self) -> bool:
        return self._loaded

    @property
    def runner(self) -> RemoteRunner | None:
        return self._runner if self._loaded else None

    def compile_cache_info(self) -> dict[str, Any] | None:
        """What the engine last sent: GetStatus never waits on the engine."""
        return self.process.cache_info

    def load(self) -> PhaseResult:
        phase, self._loaded = self._job((wire.LOAD,), None)
        return phase  # type: ignore[no-any-return]

    def run_plan(self, *, mixed_num_tokens: int | None, force: bool,
                 progress: ProgressCallback) -> WarmupReport:
        return self._job((wire.PLAN, mixed_num_tokens, force),  # type: ignore[no-any-return]
                         progress)

    def run_mixed(self, num_tokens: int, *, progress: ProgressCallback) -> WarmupReport:
        return self._job((wire.MIXED, num_tokens), progress)  # type: ignore[no-any-return]

    def launch(self) -> None:
        self.process.launch()

    def cancel(self) -> None:
        """The server stops: the warmup in flight ends at its next step (as in one process,
        where the worker's progress callback raises)."""
        with contextlib.suppress(EngineLost):
            self.process.send(wire.CANCEL)

    def close(self) -> None:
        self.process.close()

    def _job(self, command: tuple[Any, ...], progress: ProgressCallback | None) -> Any:
        """Send `command`, pass its progress on, return its value or raise its exception."""
        process = self.process
        process.send(*command)
        cancelled = False
        while True:
            try:
                message = process.next_job_message(None)
            except ShuttingDown:  # the server closed the engine under this job: a stop
                raise WarmupCancelled("the server is shutting down") from None
            assert message is not None  # no timeout: a message or the loss
            kind = message[0]
            if kind == wire.PROGRESS:
                if progress is None or cancelled:
                    continue
                try:
                    progress(message[1])
                except WarmupCancelled:
                    cancelled = True  # the engine stops at its next step and says so
                    with contextlib.suppress(EngineLost):
                        process.send(wire.CANCEL)
            elif kind == wire.DONE:
                return message[1]
            elif kind == wire.FAILED:
                raise wire.failure_of_wire(message[1], message[2])
            else:
                logger.warning("unexpected %r from the engine during %s", kind, command[0])
