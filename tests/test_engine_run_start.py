"""The engine process hears RUN from the front's event loop, right behind the request's
SUBMIT, not from the runner worker thread the run is then handed to: that thread's wake-up
(behind the GIL) is no part of a request's time to first token."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, cast

from tests.serving_helpers import greedy
from warmgate.server.control import engine_wire as wire
from warmgate.server.control.controller import WarmupController
from warmgate.server.control.engine_client import EngineProcess
from warmgate.server.control.remote_serving import RemoteServingLoop
from warmgate.server.control.serving_driver import ServingDriver
from warmgate.server.control.status import StatusTracker
from warmgate.server.control.worker import RunnerWorker
from warmgate.server.serving.limits import SchedulerLimits
from warmgate.server.serving.loop import Occupancy, StepStats
from warmgate.server.serving.request import FinishReason, ServingRequest, StepEvent

LIMITS = SchedulerLimits(max_num_seqs=4, max_num_batched_tokens=64, block_size=16,
                         num_blocks=33, max_model_len=256)


class FakeEngine:
    """The engine process as RemoteServingLoop sees it: every command is recorded with the
    thread that sent it; a RUN finishes the submitted request with one token and ends."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []
        self.handlers: dict[str, Callable[[Any], None]] = {}
        self.jobs: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self.last_heard = time.perf_counter()
        self._submitted: list[str] = []

    def send(self, *message: Any) -> None:
        self.sent.append((message[0], threading.current_thread().name))
        if message[0] == wire.SUBMIT:
            self._submitted.append(message[1].req_id)
        elif message[0] == wire.RUN:
            now = time.perf_counter()
            events = [StepEvent(r, [7], now, finish_reason=FinishReason.LENGTH)
                      for r in self._submitted]
            self._submitted = []
            self.handlers[wire.EVENTS](wire.events_to_wire(events))
            self.jobs.put((wire.DONE, None))

    def next_job_message(self, timeout: float | None) -> tuple[Any, ...] | None:
        try:
            return self.jobs.get(timeout=timeout)
        except queue.Empty:
            return None


class FakeController:
    """What ServingDriver asks of the controller: the runner worker, nothing queued on it."""

    jobs_waiting = 0

    def __init__(self, worker: RunnerWorker) -> None:
        self._worker = worker

    async def run_serving(self, fn: Callable[[], None],
                          start: Callable[[], None] | None = None) -> None:
        await self._worker.run_between_jobs(fn, start)


class RemoteRunnerFake:
    """The LoopFactory the driver builds its loop from (control/remote_serving.RemoteRunner)."""

    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine

    def serving_loop(self, emit: Callable[[list[StepEvent]], None], *,
                     on_step: Callable[[StepStats], None] | None,
                     on_occupancy: Callable[[Occupancy], None] | None) -> RemoteServingLoop:
        return RemoteServingLoop(cast(EngineProcess, self.engine), emit, 30.0,
                                 on_step=on_step, on_occupancy=on_occupancy)


def test_run_is_sent_on_the_event_loop_right_after_submit_and_once() -> None:
    async def body() -> None:
        worker = RunnerWorker(cast(StatusTracker, None))  # run_between_jobs never reports
        worker.bind()
        engine = FakeEngine()
        driver = ServingDriver(cast(WarmupController, FakeController(worker)), LIMITS)
        driver.build(RemoteRunnerFake(engine))
        loop_thread = threading.current_thread().name
        try:
            events = driver.submit(ServingRequest("gen-0", [1, 2, 3], greedy(1),
                                                  time.perf_counter()))
            event = await asyncio.wait_for(events.get(), 10)
            assert event.token_ids == [7] and event.finish_reason is FinishReason.LENGTH
            for _ in range(1000):  # the driver task ends once the run returned
                if driver.num_requests == 1 and engine.jobs.empty() and \
                        len(engine.sent) == 2:
                    break
                await asyncio.sleep(0.001)
            # The worker thread only waits for the engine's DONE: both commands left from
            # the event loop, SUBMIT first, and no second RUN came from the worker.
            assert engine.sent == [(wire.SUBMIT, loop_thread), (wire.RUN, loop_thread)]
        finally:
            await worker.shutdown(wait=True)

    asyncio.run(body())


def test_a_run_not_begun_on_the_event_loop_still_sends_run_itself() -> None:
    """run() alone (a caller that has no event loop to begin it on) starts the engine."""
    engine = FakeEngine()
    got: list[StepEvent] = []
    loop = RemoteServingLoop(cast(EngineProcess, engine), got.extend, 30.0)
    loop.submit(ServingRequest("gen-0", [1, 2, 3], greedy(1), time.perf_counter()))
    loop.run(lambda: False)
    me = threading.current_thread().name
    assert engine.sent == [(wire.SUBMIT, me), (wire.RUN, me)]
    assert [e.token_ids for e in got] == [[7]] and not loop.has_work
    loop.begin_run()
    loop.run(lambda: False)  # begun: the RUN of begin_run is the one this run waits on
    assert [kind for kind, _ in engine.sent] == [wire.SUBMIT, wire.RUN, wire.RUN]
