"""RemoteServingLoop: the serving loop of the engine process, driven like the in-process one.

ServingDriver calls submit/abort/has_work/occupancy from the event loop and run(should_yield)
on the front's runner worker, as for warmgate.server.serving.loop.ServingLoop. Submits and
aborts go down the command pipe at once (the engine's reader thread hands them to its loop,
which takes them at its next step); run() starts the engine's loop and waits for it to end,
telling it to yield when a warmup waits. Each step's events come back on the receiver thread
and go to `emit` (the driver's one call_soon_threadsafe per step), its statistics to the
metrics' callbacks.

A run that hears nothing from the engine for `step_timeout_s` has a hung step: the engine is
killed, and the run raises FatalDeviceError, which takes the server down as a crash would.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from warmgate.server.control import engine_wire as wire
from warmgate.server.control.engine_client import EngineLost, EngineProcess
from warmgate.server.core.errors import ShuttingDown
from warmgate.server.core.failures import FatalDeviceError
from warmgate.server.serving.loop import EmitEvents, Occupancy, StepStats
from warmgate.server.serving.request import ServingRequest, StepEvent

logger = logging.getLogger(__name__)

# How often a waiting run looks at should_yield and the hang bound: a warmup waits at most
# this long for the engine to hear of it, against the seconds a warmup takes.
POLL_S = 0.02


class RemoteRunner:
    """What the front holds in place of the runner once the engine has loaded it: the
    serving loop's factory (ServingDriver.build)."""

    def __init__(self, process: EngineProcess, step_timeout_s: float) -> None:
        self.process = process
        self.step_timeout_s = step_timeout_s

    def serving_loop(self, emit: EmitEvents, *,
                     on_step: Callable[[StepStats], None] | None,
                     on_occupancy: Callable[[Occupancy], None] | None) -> RemoteServingLoop:
        return RemoteServingLoop(self.process, emit, self.step_timeout_s, on_step=on_step,
                                 on_occupancy=on_occupancy)


class RemoteServingLoop:
    def __init__(self, process: EngineProcess, emit: EmitEvents, step_timeout_s: float, *,
                 on_step: Callable[[StepStats], None] | None = None,
                 on_occupancy: Callable[[Occupancy], None] | None = None) -> None:
        self._process = process
        self._emit = emit
        self._step_timeout_s = step_timeout_s
        self._on_step = on_step
        self._on_occupancy = on_occupancy
        self._lock = threading.Lock()
        # Submitted and not ended by an event (finished, failed) or an abort.
        self._open: set[str] = set()
        # An abort sent since the last run started: a run frees its blocks.
        self._abort_pending = False
        self._occupancy = Occupancy(0, 0, 0, 0)
        # begin_run() sent RUN for the next run() (set on the event loop, read on the worker
        # thread the run is handed to after it).
        self._begun = False
        self.num_steps = 0
        process.handlers[wire.EVENTS] = self._on_events
        process.handlers[wire.STEP] = self._on_step_stats
        process.handlers[wire.OCCUPANCY] = self._on_occupancy_now

    # -- any thread ---------------------------------------------------------------------

    def submit(self, req: ServingRequest) -> None:
        with self._lock:
            self._open.add(req.req_id)
        try:
            self._process.send(wire.SUBMIT, wire.RequestWire.of(req))
        except EngineLost:  # the loss takes the server down; this stream ends now
            with self._lock:
                self._open.discard(req.req_id)
            self._emit([StepEvent(req.req_id, [], time.perf_counter(), error=ShuttingDown())])

    def abort(self, req_id: str) -> None:
        with self._lock:
            self._open.discard(req_id)
            self._abort_pending = True
        try:
            self._process.send(wire.ABORT, req_id)
        except EngineLost:
            with self._lock:
                self._abort_pending = False

    @property
    def has_work(self) -> bool:
        with self._lock:
            return bool(self._open) or self._abort_pending

    def occupancy(self) -> Occupancy:
        return self._occupancy

    def begin_run(self) -> None:
        """Tell the engine to run its loop now, from the event loop that holds the runner:
        RUN then follows the request's SUBMIT down the pipe at once, instead of after the
        front's worker thread woke and took the GIL (0.1-0.2 ms a request on a 2-core CPU,
        up to 2 ms while the event loop held the GIL)."""
        with self._lock:
            self._abort_pending = False  # the aborts sent so far reach this run first
        self._process.last_heard = time.perf_counter()
        self._process.send(wire.RUN)
        self._begun = True

    # -- the receiver thread ------------------------------------------------------------

    def _on_events(self, rows: list[wire.EventRow]) -> None:
        events = wire.events_of_wire(rows)
        ended = [e.req_id for e in events if e.finish_reason is not None or e.error is not None]
        if ended:
            with self._lock:
                self._open.difference_update(ended)
        self._emit(events)

    def _on_step_stats(self, stats: StepStats) -> None:
        self.num_steps += 1
        self._occupancy = Occupancy(stats.num_running, stats.num_waiting,
                                    stats.num_blocks_used, stats.num_blocks_usable)
        if self._on_step is not None:
            self._on_step(stats)

    def _on_occupancy_now(self, occupancy: Occupancy) -> None:
        self._occupancy = occupancy
        if self._on_occupancy is not None:
            self._on_occupancy(occupancy)

    # -- the front's runner worker ------------------------------------------------------

    def run(self, should_yield: Callable[[], bool]) -> None:
        """The engine's loop, until no request is left or it yielded to a warmup; started
        here unless begin_run() started it."""
        process = self._process
        if not self._begun:
            self.begin_run()
        self._begun = False
        yielded = False
        while True:
            message = process.next_job_message(POLL_S)
            if message is None:
                if not yielded and should_yield():
                    process.send(wire.YIELD)
                    yielded = True
                silent = time.perf_counter() - process.last_heard
                if silent > self._step_timeout_s:
                    reason = (f"a serving step made no progress for {silent:.1f} s "
                              f"(--engine-step-timeout {self._step_timeout_s:g})")
                    process.kill(reason)
                    raise FatalDeviceError("serving", EngineLost(reason))
                continue
            kind = message[0]
            if kind == wire.DONE:
                return
            if kind == wire.FAILED:
                raise wire.failure_of_wire(message[1], message[2])
            logger.warning("unexpected %r from the engine during a serving run", kind)
