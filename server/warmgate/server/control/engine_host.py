"""EngineHost: the engine process's side (engine_main.py runs it).

The main thread runs one job at a time, as the front's runner worker does in one process:
the model load, a warmup plan, a mixed warmup, a serving run. A reader thread takes the
front's commands off stdin: jobs go to the main thread's queue; submits and aborts go
straight into the serving loop (which takes them at its next step, so a request that
arrives mid-run is picked up without waiting for the run to end); a yield sets the flag the
loop's should_yield reads between steps; a cancel the flag the warmup's progress callback
raises WarmupCancelled on; readiness goes to the JIT monitor; grammar builds go to their own
threads (engine_grammars.py), so the reader is never held up by a compile. End of file (the
front stopped or died) ends the process at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from warmgate.server.cache.store import compile_cache_of
from warmgate.server.config.server_config import ServerConfig
from warmgate.server.control import engine_wire as wire
from warmgate.server.control.engine import PlanEngine
from warmgate.server.control.engine_grammars import EngineGrammars
from warmgate.server.control.faults import FaultInjector
from warmgate.server.control.heap_freeze import freeze_warm_heap, thaw_warm_heap
from warmgate.server.control.worker import WarmupCancelled
from warmgate.server.core.failures import FatalDeviceError
from warmgate.server.core.progress import ProgressEvent
from warmgate.server.core.tracebacks import log_failure
from warmgate.server.distributed.channel import encode, receive, send_encoded
from warmgate.server.serving.limits import SchedulerLimits
from warmgate.server.serving.loop import ServingLoop
from warmgate.server.serving.ngram import NgramIndex
from warmgate.server.serving.request import ServingRequest, StepEvent
from warmgate.server.serving.scheduler import Scheduler
from warmgate.server.text.model_text import ModelText

logger = logging.getLogger(__name__)


class ReplyChannel:
    """The pipe back to the front; written from the main thread, the reader thread and
    whatever thread the JIT observers record on."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def send(self, *message: Any) -> None:
        data = encode(message)
        # The front gone: the reader's end of file ends this process.
        with self._lock, contextlib.suppress(OSError, ValueError):
            send_encoded(self._stream, data)


class EngineHost:
    def __init__(self, config: ServerConfig, out: ReplyChannel, text: ModelText) -> None:
        """text: what the front loaded from the model directory at start-up (the warmup's
        grammars and the requests' are built on its vocabulary)."""
        self._config = config
        self._out = out
        faults = FaultInjector(config.faults) if config.faults else None
        if faults is not None:
            logger.warning("FAULT INJECTION ON (test only): %s", config.faults)
        self.engine = PlanEngine(config.runner, faults=faults, cache=compile_cache_of(config),
                                 text=text)
        self.grammars = EngineGrammars(text, config.runner.model.vocab_size, config.serving,
                                       out)
        self.engine.jit_monitor.add_listener(lambda event: out.send(wire.JIT, event))
        self.engine.on_fatal = self._worker_lost
        self._limits = SchedulerLimits.of_config(
            config.runner, async_scheduling=config.serving.async_scheduling)
        self._jobs: queue.Queue[tuple[Any, ...] | None] = queue.Queue()
        self._yield = threading.Event()
        self._cancel = threading.Event()
        self._serving: ServingLoop | None = None

    # -- the reader thread --------------------------------------------------------------

    def read_commands(self, stdin: IO[bytes], on_eof: Callable[[], None]) -> None:
        while (message := receive(stdin)) is not None:
            kind = message[0]
            if kind == wire.SUBMIT:
                self._submit(message[1])
            elif kind == wire.ABORT:
                self.grammars.release(message[1])
                self._require_serving().abort(message[1])
            elif kind == wire.GRAMMAR_BUILD:
                self.grammars.build(*message[1:])
            elif kind == wire.GRAMMAR_RELEASE:
                self.grammars.release(message[1])
            elif kind == wire.YIELD:
                self._yield.set()
            elif kind == wire.CANCEL:
                self._cancel.set()
            elif kind == wire.READY:
                monitor = self.engine.jit_monitor
                monitor.mark_ready() if message[1] else monitor.mark_not_ready()
            else:
                self._jobs.put(message)
        on_eof()

    def _submit(self, request: wire.RequestWire) -> None:
        try:
            drafter = (NgramIndex(self._config.serving.ngram_min, self._config.serving.ngram_max)
                       if self._limits.num_speculative_steps else None)
            grammar = self.grammars.take(request.req_id) if request.grammar else None
            req = ServingRequest(request.req_id, request.prompt_token_ids, request.params,
                                 request.arrival_s, drafter, grammar)
        except Exception as exc:  # the stream ends with it; the engine serves on
            # Logged here with its traceback, and marked so: the front logs one line for it.
            log_failure(logger, exc, "request %s could not be rebuilt in the engine",
                        request.req_id)
            self._emit([StepEvent(request.req_id, [], time.perf_counter(), error=exc)])
            return
        self._require_serving().submit(req)

    # -- the main thread ----------------------------------------------------------------

    def run_jobs(self) -> None:
        while (job := self._jobs.get()) is not None:
            kind = job[0]
            try:
                value = self._run(kind, job[1:])
            except BaseException as exc:  # WarmupCancelled too: the front re-raises it
                if not isinstance(exc, (WarmupCancelled, FatalDeviceError)):
                    # Marked as logged: the front, which raises it again, logs one line.
                    log_failure(logger, exc, "the engine's %s job raised", kind)
                self._out.send(wire.FAILED, *wire.failure_to_wire(exc))
            else:
                self._out.send(wire.DONE, value)
            if kind != wire.RUN:
                self._out.send(wire.CACHE_INFO, self.engine.compile_cache_info())

    def stop(self) -> None:
        self._jobs.put(None)

    def _run(self, kind: str, args: tuple[Any, ...]) -> Any:
        if kind == wire.RUN:
            self._yield.clear()  # a yield meant for the run before this one
            self._require_serving().run(self._yield.is_set)
            return None
        if kind == wire.LOAD:
            phase = self.engine.load()
            runner = self.engine.runner
            if runner is not None:
                self._serving = ServingLoop(
                    runner, Scheduler(self._limits), self._emit,
                    on_step=lambda stats: self._out.send(wire.STEP, stats),
                    on_occupancy=lambda occ: self._out.send(wire.OCCUPANCY, occ))
            return phase, runner is not None
        self._cancel.clear()  # a cancel meant for the job before this one
        if kind == wire.PLAN:
            thaw_warm_heap(self.engine.runner)
            report = self.engine.run_plan(mixed_num_tokens=args[0], force=args[1],
                                          progress=self._progress)
        elif kind == wire.MIXED:
            thaw_warm_heap(self.engine.runner)
            report = self.engine.run_mixed(args[0], progress=self._progress)
        else:
            raise ValueError(f"unknown engine command {kind!r}")
        if report.succeeded:  # before the reply: the front turns SERVING only after it
            freeze_warm_heap("engine", self.engine.runner)
        return report

    def _progress(self, event: ProgressEvent) -> None:
        if self._cancel.is_set():
            raise WarmupCancelled("the server is shutting down")
        self._out.send(wire.PROGRESS, event)

    def _emit(self, events: list[StepEvent]) -> None:
        self._out.send(wire.EVENTS, wire.events_to_wire(events))

    def _worker_lost(self, exc: FatalDeviceError) -> None:
        self._out.send(wire.LOST, wire.error_to_wire(exc.cause))

    def _require_serving(self) -> ServingLoop:
        if self._serving is None:  # the front submits only once the load succeeded
            raise RuntimeError("the engine got a request before its model was loaded")
        return self._serving


def exit_now(code: int) -> None:
    """Leave without joining the main thread, which may be inside a step."""
    logging.shutdown()
    os._exit(code)
