"""ServingLoop: scheduler steps on the runner's worker thread.

The asyncio side submits requests and aborts from the event loop (any thread); `run` takes
them in between steps, so the scheduler and the runner are only ever touched by the worker.
`run` returns when no request is left, or when `should_yield` says other runner work (a
warmup) is waiting: it then preempts every running request first, because a warmup writes
into the KV cache's blocks from 1 up, and those requests recompute when serving resumes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from warmgate.server.core.failures import FatalDeviceError, is_fatal_device_error
from warmgate.server.core.tracebacks import log_failure
from warmgate.server.runner.scheduler_output import ModelRunnerOutput
from warmgate.server.serving.grammar.step_bitmask import grammar_output_for
from warmgate.server.serving.overlap import InFlight, LaunchedOutput, overlap_blocker
from warmgate.server.serving.request import ServingRequest, StepEvent
from warmgate.server.serving.scheduler import Scheduler, StepPlan
from warmgate.server.serving.step_output import advance_launched

logger = logging.getLogger(__name__)

EmitEvents = Callable[[list[StepEvent]], None]


@dataclass(frozen=True)
class Occupancy:
    """What the scheduler holds right now, for the gauges."""

    num_running: int
    num_waiting: int
    num_blocks_used: int
    num_blocks_usable: int


# StepStats.kind's values, the label of the step metrics.
STEP_KINDS = ("decode", "mixed", "prefill")


@dataclass(frozen=True)
class StepStats:
    """One step, for metrics: how big it was and how long it took."""

    seconds: float
    num_reqs: int
    num_tokens: int
    num_running: int
    num_waiting: int
    num_blocks_used: int
    num_blocks_usable: int
    # With async scheduling: why this step did not overlap with the one before it
    # (serving/overlap.py SERIAL_REASONS), None when it did.
    serial_reason: str | None = None
    num_prompt_tokens: int = 0  # of num_tokens, prompt chunks (the rest decode)

    @property
    def kind(self) -> str:
        """decode: no prompt tokens; prefill: nothing but prompt tokens; mixed: prompt chunks
        beside decodes, the steps whose prompts every decoding stream waits for."""
        if not self.num_prompt_tokens:
            return "decode"
        return "prefill" if self.num_prompt_tokens == self.num_tokens else "mixed"


class _Ready:
    """A step's output the host already holds (serial stepping, or a pooling model)."""

    sync_reason: str | None = None

    def __init__(self, output: ModelRunnerOutput | None) -> None:
        self._output = output

    def get(self) -> ModelRunnerOutput | None:
        return self._output


class ServingLoop:
    def __init__(self, runner: Any, scheduler: Scheduler, emit: EmitEvents, *,
                 on_step: Callable[[StepStats], None] | None = None,
                 on_occupancy: Callable[[Occupancy], None] | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.runner = runner
        self.scheduler = scheduler
        self._emit = emit
        self._on_step = on_step
        # Blocks also come free between steps (cancelled streams, a yield to a warmup, the
        # last request ending); the gauges must not keep the last step's values until the
        # next request arrives.
        self._on_occupancy = on_occupancy
        self._clock = clock
        self._lock = threading.Lock()
        self._inbox: list[ServingRequest] = []
        self._aborts: list[str] = []
        self.num_steps = 0
        # Overlapped scheduling (--async-scheduling) needs the runner's device-side sampling;
        # a runner without it (a test fake, a developer tool's) steps serially.
        self.async_scheduling = (scheduler.limits.async_scheduling
                                 and hasattr(runner, "sample_tokens_async"))
        self._inflight: InFlight | None = None

    # -- any thread ---------------------------------------------------------------------

    def submit(self, req: ServingRequest) -> None:
        with self._lock:
            self._inbox.append(req)

    def abort(self, req_id: str) -> None:
        with self._lock:
            self._aborts.append(req_id)

    @property
    def has_work(self) -> bool:
        with self._lock:
            queued = bool(self._inbox or self._aborts)
        return queued or self.scheduler.has_runner_work or self._inflight is not None

    def begin_run(self) -> None:
        """Nothing to start ahead: run() steps on the worker thread it is called on."""

    # -- the worker thread --------------------------------------------------------------

    def run(self, should_yield: Callable[[], bool]) -> None:
        """Step until no request is left or should_yield() (checked between steps)."""
        while True:
            self._take_inbox()
            if not self.scheduler.has_requests:
                self._complete_inflight()  # every request of it was aborted
                self._drop_finished()
                self._report_occupancy()
                return
            if should_yield():
                self._complete_inflight()
                logger.info("serving pauses for other runner work: %d running requests "
                            "preempted, %d waiting", len(self.scheduler.running),
                            len(self.scheduler.waiting))
                self.scheduler.preempt_all()
                self._drop_finished()
                self._report_occupancy()
                return
            self.step()

    def step(self) -> None:
        """Take what was submitted, then run one scheduler step. With async scheduling the
        step is launched before the step in flight is read, and stays in flight itself."""
        self._take_inbox()
        start = self._clock()
        serial = None
        if self._inflight is not None:
            serial = overlap_blocker(self.scheduler)
            if serial is not None:
                logger.debug("serial step (%s): the next step waits for the last one's tokens "
                             "(%d running, %d waiting)", serial, len(self.scheduler.running),
                             len(self.scheduler.waiting))
                self._complete_inflight()
        plan = self.scheduler.schedule(start)
        if plan.errors:
            self._emit(plan.errors)
        if plan.is_empty:
            if plan.scheduler_output.finished_req_ids:  # drops that schedule() took along
                self.runner.execute_model(plan.scheduler_output)
            if self._inflight is not None:  # what is left only waits for its tokens
                self._complete_inflight()
                return
            self._drop_finished()
            if self.scheduler.running:  # only possible on a bug; never spin on it
                raise RuntimeError("the scheduler scheduled nothing with requests running")
            return
        try:
            launched = self._launch(plan)
        except Exception as exc:
            self._complete_inflight()  # its tokens were sampled before this step failed
            self._fail(plan, exc)
            return
        # Tokens left on the device: the requests move on now, the next step is built on them.
        deferred = not isinstance(launched, _Ready) and launched.sync_reason is None
        if self.async_scheduling and launched.sync_reason is not None:
            logger.debug("serial step (%s): %d requests sampled on the host",
                         launched.sync_reason, plan.scheduler_output.num_reqs)
        if deferred:
            advance_launched(plan)
        previous = self._inflight
        self._inflight = InFlight(plan, launched, start, serial or launched.sync_reason)
        if previous is not None:
            self._complete(previous)  # the one wait, with the next step already queued
        if not deferred:
            self._complete_inflight()

    def _launch(self, plan: StepPlan) -> LaunchedOutput:
        """Run the step's forward and sampling; with async scheduling the tokens are left on
        the device where the runner allows it."""
        out = self.runner.execute_model(plan.scheduler_output)
        if out is None and self.async_scheduling:
            launched = self.runner.sample_tokens_async(grammar_output_for(plan))
            return launched if launched is not None else _Ready(None)
        if out is None:
            # Filled on the host while the device runs the forward.
            out = self.runner.sample_tokens(grammar_output_for(plan))
        return _Ready(out)

    def _complete_inflight(self) -> None:
        step, self._inflight = self._inflight, None
        if step is not None:
            self._complete(step)

    def _complete(self, step: InFlight) -> None:
        """Wait for a launched step's tokens, advance its requests and emit their events."""
        plan = step.plan
        try:
            out = step.output.get()
        except Exception as exc:
            self._fail(plan, exc)
            return
        end = self._clock()
        self.num_steps += 1
        self._emit(self.scheduler.update(plan, out, end))
        if self._on_step is not None:
            so = plan.scheduler_output
            s = self.scheduler
            self._on_step(StepStats(end - step.start_s, so.num_reqs,
                                    so.total_num_scheduled_tokens, len(s.running),
                                    len(s.waiting), s.num_blocks_used, s.pool.num_usable,
                                    step.serial_reason if self.async_scheduling else None,
                                    plan.num_prompt_tokens))

    def _take_inbox(self) -> None:
        with self._lock:
            new, self._inbox = self._inbox, []
            aborts, self._aborts = self._aborts, []
        for req in new:
            self.scheduler.add(req)
        aborted = 0
        for req_id in aborts:
            if self.scheduler.abort(req_id):
                aborted += 1
                logger.info("aborted %s (stream cancelled); %d blocks free", req_id,
                            self.scheduler.pool.num_free)
        if aborted:
            self._report_occupancy()

    def occupancy(self) -> Occupancy:
        s = self.scheduler
        return Occupancy(len(s.running), len(s.waiting), s.num_blocks_used, s.pool.num_usable)

    def _report_occupancy(self) -> None:
        if self._on_occupancy is not None:
            self._on_occupancy(self.occupancy())

    def _drop_finished(self) -> None:
        """Tell the runner to drop finished and preempted requests' state."""
        so = self.scheduler.drop_only_output()
        if so.finished_req_ids:
            self.runner.execute_model(so)

    def _fail(self, plan: StepPlan, exc: Exception) -> None:
        if is_fatal_device_error(exc):
            raise FatalDeviceError("serving", exc) from exc
        # Logged here once: each of the step's streams then ends INTERNAL with a line.
        log_failure(logger, exc, "a serving step of %d requests / %d tokens failed; they end "
                    "with the error", plan.scheduler_output.num_reqs,
                    plan.scheduler_output.total_num_scheduled_tokens)
        self._emit(self.scheduler.fail(plan, exc, self._clock()))
        self._drop_finished()
