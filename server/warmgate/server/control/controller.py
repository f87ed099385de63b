"""WarmupController: the control layer's one front door, assembled from its parts.

- RunnerWorker (worker.py): the thread that owns the runner, and the order of its jobs;
- Readiness (readiness.py): SERVING or not, and the listeners (gRPC health, the metrics
  gauge) that follow it;
- WarmupRuns (warmups.py): the single-flight warmup entry points;
- StatusTracker (status.py): what GetStatus and WatchStatus report.

What is left here is the server's lifecycle: the model load at start, a drain, a stop, and a
fatal device error, each of which touches several parts in a fixed order.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from typing import Any

from warmgate.server.control.engine import WarmupEngine
from warmgate.server.control.readiness import Readiness, ReadinessListener, WarmupMetrics
from warmgate.server.control.singleflight import Shared
from warmgate.server.control.status import (
    Identity,
    StatusSnapshot,
    StatusTracker,
    not_ready_sentence,
    with_readiness,
)
from warmgate.server.control.warmups import WarmupRuns
from warmgate.server.control.worker import RunnerWorker
from warmgate.server.core.errors import FailedPrecondition, ShuttingDown
from warmgate.server.core.failures import FatalDeviceError, describe_fatal
from warmgate.server.core.phases import LOAD, PLAN_PHASES
from warmgate.server.core.progress import ProgressEvent
from warmgate.server.core.results import PhaseResult, PhaseStatus, WarmupOutcome, WarmupReport
from warmgate.server.jit import JitMonitor, StrictJitPolicy

logger = logging.getLogger(__name__)

# While runner work is in flight a watcher gets a fresh status at least this often, so a
# progress bar's elapsed time and estimate move during one long step (a long JIT compile).
HEARTBEAT_S = 1.0


class WarmupController:
    def __init__(self, engine: WarmupEngine, identity: Identity, *, max_num_batched_tokens: int,
                 default_mixed_num_tokens: int | None = None,
                 listeners: Sequence[ReadinessListener] = (),
                 metrics: WarmupMetrics | None = None,
                 plan_phases: Sequence[str] = PLAN_PHASES,
                 jit_monitor: JitMonitor | None = None, strict_jit: str = "warn") -> None:
        self._engine = engine
        self._identity = identity
        self._metrics = metrics
        self._jit = jit_monitor
        self._tracker = StatusTracker(identity, cache_info=engine.compile_cache_info)
        self._background: set[asyncio.Task[None]] = set()
        self._worker = RunnerWorker(self._tracker)
        self._readiness = Readiness(self._tracker, self._spawn, listeners=listeners,
                                    metrics=metrics)
        self._warmups = WarmupRuns(
            engine, identity, worker=self._worker, tracker=self._tracker,
            readiness=self._readiness, max_num_batched_tokens=max_num_batched_tokens,
            default_mixed_num_tokens=default_mixed_num_tokens, plan_phases=plan_phases,
            jit_monitor=jit_monitor, metrics=metrics, on_fatal=self.device_lost)
        if jit_monitor is not None:
            # Ready once a plan succeeded; every compile it sees from then on is traffic's.
            jit_monitor.add_listener(StrictJitPolicy(strict_jit, self._jit_failed_threadsafe))

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self, *, warmup_on_start: bool) -> None:
        """Load the model in the background and, if asked, run the plan after it."""
        self._worker.bind()
        await self._readiness.set_serving(False)
        self._spawn(self._load())
        if warmup_on_start:
            self._spawn(self._warm_on_start())

    def begin_drain(self) -> None:
        """Shutdown started: refuse warmups from now on (UNAVAILABLE, like Generate), so none
        preempts the streams the grace period is for; running streams keep the runner."""
        self._warmups.begin_drain()

    async def close(self, *, wait: bool = False) -> None:
        """Stop taking work, abort the run in progress at its next step, end watches."""
        warming = self._warmups.warming
        if not self._worker.closing and warming is not None:
            snap = self._tracker.snapshot()
            # A stop, not a failure: one INFO line here, nothing from the run it cancels.
            logger.info("warmup cancelled: the server is shutting down (the %s warmup stops at "
                        "its next step; last progress: phase %s, step %d/%d)", warming,
                        snap.current_phase or "-", snap.steps_done, snap.steps_total)
        self._worker.stop_taking_work()
        self._tracker.notify()
        for task in list(self._background):
            task.cancel()
        await self._worker.shutdown(wait=wait)  # wait: tests leave no runner thread behind

    @property
    def fatal_error(self) -> BaseException | None:
        """The unrecoverable device error that took the server down, if one did."""
        return self._readiness.fatal_error

    async def wait_fatal(self) -> BaseException:
        """Return once a fatal device error happened (main then exits non-zero)."""
        return await self._readiness.wait_fatal()

    async def device_lost(self, exc: BaseException) -> None:
        """A sticky device error: NOT_SERVING for good, take no more work, tell main to exit.

        Every listener turns NOT_SERVING for good (gRPC health through
        enter_graceful_shutdown, "liveness" included): a process whose CUDA context is gone
        must never look healthy again.
        """
        if self._readiness.fatal_error is not None:
            return
        self._worker.stop_taking_work()
        await self._readiness.device_lost(exc)

    async def wait_runner_idle(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the worker to finish its step; False if it did not."""
        return await self._worker.wait_idle(timeout)

    # -- the RPCs' domain calls ---------------------------------------------------------

    async def warmup_kernels(self, *, force: bool = False, mixed_num_tokens: int | None = None
                             ) -> Shared[WarmupReport]:
        return await self._warmups.warmup_kernels(force=force,
                                                  mixed_num_tokens=mixed_num_tokens)

    async def mixed_warmup(self, num_tokens: int, *, force: bool = False
                           ) -> Shared[WarmupReport]:
        return await self._warmups.mixed_warmup(num_tokens, force=force)

    def status(self) -> StatusSnapshot:
        """The tracker's snapshot plus what only the controller knows: why health is not
        SERVING, and the CUDA-graph misses serving has hit since ready."""
        misses = self._jit.snapshot().graph_misses_after_ready if self._jit is not None else 0
        return with_readiness(self._tracker.snapshot(), serving=self._readiness.serving,
                              shutting_down=self._shutting_down,
                              graph_misses_after_ready=misses)

    async def watch(self, *, follow: bool = False) -> AsyncIterator[StatusSnapshot]:
        """The status now, then after every change; ends once settled unless following."""
        seen = -1
        while not self._worker.closing:
            if self._tracker.version != seen:
                seen = self._tracker.version
                snapshot = self.status()
                yield snapshot
                if snapshot.settled and not follow:
                    return
            timeout = HEARTBEAT_S if self._tracker.work_in_flight else None
            try:
                await asyncio.wait_for(self._tracker.wait_change(seen), timeout)
            except asyncio.TimeoutError:
                seen = -1  # resend: elapsed and the estimate have moved

    # -- serving ------------------------------------------------------------------------

    @property
    def jobs_waiting(self) -> int:
        """Runner jobs (load, warmups) queued behind the lock; read from the worker thread."""
        return self._worker.jobs_waiting

    @property
    def serving(self) -> bool:
        """Health is SERVING: a warmup plan succeeded and nothing has failed since."""
        return self._readiness.serving

    @property
    def model_loaded(self) -> bool:
        return self._engine.loaded

    def not_ready_reason(self) -> str:
        """Where the warmup stands, in a sentence, for an UNAVAILABLE answer."""
        return not_ready_sentence(self._tracker.snapshot(), shutting_down=self._shutting_down)

    def add_ready_listener(self, fn: Callable[[], None]) -> None:
        """fn() on the event loop each time a plan succeeds, before health turns SERVING
        (Readiness.add_ready_hook)."""
        self._readiness.add_ready_hook(fn)

    def set_rehearsal(self, fn: Callable[[], Awaitable[None]]) -> None:
        """fn() after the first plan that succeeds, out of its job and before health turns
        SERVING: requests through the serving path (GenerationService.rehearse); an exception
        keeps health NOT_SERVING with the reason."""
        self._warmups.rehearsal = fn

    async def run_serving(self, fn: Callable[[], None],
                          start: Callable[[], None] | None = None) -> None:
        """fn (the serving loop) on the worker, between runner jobs, after start() on the
        event loop; a fatal device error takes the server down and ends fn's callers with
        UNAVAILABLE."""
        try:
            await self._worker.run_between_jobs(fn, start)
        except FatalDeviceError as exc:
            await self.device_lost(exc)
            raise ShuttingDown() from exc

    # -- internals ----------------------------------------------------------------------

    @property
    def _shutting_down(self) -> bool:
        return self._worker.closing or self._warmups.draining

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _load(self) -> None:
        async with self._worker.job():
            self._tracker.begin(LOAD, (LOAD,))
            self._tracker.progress(ProgressEvent(LOAD, 0, 1))
            try:
                phase = await self._worker.run(self._engine.load)
            except FatalDeviceError as exc:
                phase = PhaseResult(name=LOAD, status=PhaseStatus.FAILED,
                                    detail=describe_fatal(LOAD, exc.cause))
                await self.device_lost(exc)
            self._tracker.end_load(phase)
            self._readiness.observe_state()
            # A load is no warmup: its phase line was logged where it ran, and it gets no
            # "warmup outcome=" summary; the metrics record its duration.
            if self._metrics is not None:
                self._metrics.observe_report(WarmupReport(
                    WarmupOutcome.SUCCEEDED if phase.ok else WarmupOutcome.FAILED, [phase],
                    phase.duration_s, self._identity.config_hash))

    async def _warm_on_start(self) -> None:
        try:
            shared = await self.warmup_kernels()
            logger.info("start-up warmup: %s in %.3f s", shared.value.outcome.value,
                        shared.value.total_duration_s)
        except ShuttingDown:
            pass  # a stop, logged once where the run was cancelled (or before it started)
        except FailedPrecondition as exc:
            logger.error("start-up warmup did not run: %s", exc)

    def _jit_failed_threadsafe(self, reason: str) -> None:
        """--strict-jit=fail saw a compile after ready; called on the compiling thread:
        FAILED with the compile's batch as the reason, and NOT_SERVING."""
        self._worker.call_soon(self._readiness.lose, reason)
