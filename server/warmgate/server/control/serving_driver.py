"""ServingDriver: keeps the serving loop running on the runner worker while requests are left.

The serving loop (warmgate.server.serving.loop) is built once, on the event loop. A driver
task runs it on the controller's worker thread, between warmup jobs, which it yields to at
its next step; the task ends when no request is left and the next submit starts a new one.
The worker hands each step's events to the event loop with one call_soon_threadsafe, and each
request's events go to its own queue, which its stream reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from warmgate.server.control.controller import WarmupController
from warmgate.server.core.errors import ShuttingDown
from warmgate.server.core.tracebacks import log_failure
from warmgate.server.serving.limits import SchedulerLimits
from warmgate.server.serving.loop import Occupancy, ServingLoop, StepStats
from warmgate.server.serving.request import ServingRequest, StepEvent
from warmgate.server.serving.scheduler import Scheduler

if TYPE_CHECKING:  # warmup's package imports the torch-heavy plan; the checker only needs this
    from warmgate.server.warmup.runner_contract import WarmupRunner

logger = logging.getLogger(__name__)


class LoopHost(Protocol):
    """The serving loop as the driver uses it: the in-process ServingLoop, or the engine
    process's (control/remote_serving.py)."""

    def submit(self, req: ServingRequest) -> None: ...

    def abort(self, req_id: str) -> None: ...

    @property
    def has_work(self) -> bool: ...

    def begin_run(self) -> None:
        """On the event loop, once the runner is this loop's and just before run() goes to
        the worker thread (a loop in another process starts here)."""

    def run(self, should_yield: Callable[[], bool]) -> None: ...

    def occupancy(self) -> Occupancy: ...


@runtime_checkable
class LoopFactory(Protocol):
    """A runner that lives elsewhere builds the serving loop that drives it."""

    def serving_loop(self, emit: Callable[[list[StepEvent]], None], *,
                     on_step: Callable[[StepStats], None] | None,
                     on_occupancy: Callable[[Occupancy], None] | None) -> LoopHost: ...


class ServingDriver:
    def __init__(self, controller: WarmupController, limits: SchedulerLimits, *,
                 on_step: Callable[[StepStats], None] | None = None,
                 on_occupancy: Callable[[Occupancy], None] | None = None) -> None:
        self._controller = controller
        self._limits = limits
        self._on_step = on_step
        self._on_occupancy = on_occupancy
        self._queues: dict[str, asyncio.Queue[StepEvent]] = {}
        self._serving: LoopHost | None = None
        self._driver: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def serving_loop(self) -> ServingLoop | None:
        """The in-process loop, once built (tests read its scheduler)."""
        return self._serving if isinstance(self._serving, ServingLoop) else None

    @property
    def num_requests(self) -> int:
        """Requests submitted whose stream has not closed yet (running or queued)."""
        return len(self._queues)

    def build(self, runner: WarmupRunner | LoopFactory) -> LoopHost:
        """The serving loop, built once, on the event loop (its emits are scheduled there)."""
        if self._serving is None:
            self._loop = asyncio.get_running_loop()
            if isinstance(runner, LoopFactory):
                self._serving = runner.serving_loop(self._emit_threadsafe, on_step=self._on_step,
                                                    on_occupancy=self._on_occupancy)
            else:
                self._serving = ServingLoop(runner, Scheduler(self._limits),
                                            self._emit_threadsafe, on_step=self._on_step,
                                            on_occupancy=self._on_occupancy)
            logger.info("serving loop ready: %d KV blocks of %d tokens, max_num_seqs %d, "
                        "token budget %d", self._limits.num_blocks, self._limits.block_size,
                        self._limits.max_num_seqs, self._limits.max_num_batched_tokens)
        return self._serving

    def submit(self, req: ServingRequest) -> asyncio.Queue[StepEvent]:
        """Queue `req` on the built loop; its events arrive on the returned queue."""
        serving = self._require_loop()
        queue: asyncio.Queue[StepEvent] = asyncio.Queue()
        self._queues[req.req_id] = queue
        serving.submit(req)
        self._ensure_driver()
        return queue

    def close(self, req_id: str, *, abort: bool) -> None:
        """The request's stream ended; with `abort` (cancel, error) free its KV blocks at the
        next step boundary (a no-op for a request the scheduler already ended)."""
        self._queues.pop(req_id, None)
        if abort:
            self._require_loop().abort(req_id)
            self._ensure_driver()

    def fail_all(self, error: BaseException) -> None:
        """End every open stream with `error`."""
        now = time.perf_counter()
        for req_id, queue in list(self._queues.items()):
            queue.put_nowait(StepEvent(req_id, [], now, error=error))

    def _require_loop(self) -> LoopHost:
        if self._serving is None:
            raise RuntimeError("ServingDriver.build() was not called")
        return self._serving

    def _ensure_driver(self) -> None:
        if self._driver is None:
            self._driver = asyncio.ensure_future(self._drive())

    async def _drive(self) -> None:
        serving = self._require_loop()
        try:
            while serving.has_work:
                await self._controller.run_serving(lambda: serving.run(self._should_yield),
                                                   serving.begin_run)
        except Exception as exc:  # ShuttingDown, a fatal device error, or a bug
            if not isinstance(exc, ShuttingDown):
                log_failure(logger, exc, "the serving loop failed; ending every stream")
            self.fail_all(exc)
        finally:
            # No await since the last has_work check: a request submitted after it finds
            # _driver None and starts a new driver.
            self._driver = None

    def _should_yield(self) -> bool:
        """Asked on the worker between steps: a warmup (or load) is waiting for the runner."""
        return self._controller.jobs_waiting > 0

    def _emit_threadsafe(self, events: list[StepEvent]) -> None:
        loop = self._loop
        if loop is not None and events:
            with contextlib.suppress(RuntimeError):  # the event loop is gone: nobody listens
                loop.call_soon_threadsafe(self._dispatch, events)

    def _dispatch(self, events: list[StepEvent]) -> None:
        for event in events:
            queue = self._queues.get(event.req_id)
            if queue is not None:
                queue.put_nowait(event)
