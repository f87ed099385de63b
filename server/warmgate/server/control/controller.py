"""WarmupController: owns the runner's worker thread, the warmup state and readiness.

All runner work (load, the warmup plan, mixed warmups) runs on one dedicated thread, one job
at a time: the event loop only awaits it, so health checks are answered while kernels compile.
An asyncio.Lock orders the jobs and their state updates (not `maximum_concurrent_rpcs=1`,
which would also turn health checks away). Progress reaches the loop through
`call_soon_threadsafe`, before the job's own completion, so watchers see every phase end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio

from warmgate.server.control.engine import WarmupEngine
from warmgate.server.control.singleflight import Shared, SingleFlight
from warmgate.server.control.status import (
    Identity,
    StatusSnapshot,
    StatusTracker,
    WarmupState,
    not_ready_sentence,
    with_readiness,
)
from warmgate.server.core.errors import (
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    ShuttingDown,
)
from warmgate.server.core.failures import FatalDeviceError, describe_fatal
from warmgate.server.core.phases import MIXED_PHASES, PLAN_PHASES
from warmgate.server.core.progress import ProgressEvent
from warmgate.server.core.results import (
    PhaseResult,
    PhaseStatus,
    WarmupOutcome,
    WarmupReport,
)
from warmgate.server.jit import JitMonitor, StrictJitPolicy
from warmgate.server.telemetry.metrics import Metrics
from warmgate.server.telemetry.report_log import log_phase, log_report

logger = logging.getLogger(__name__)
T = TypeVar("T")

SERVICE_NAMES = ("", "warmgate.v1.Warmup")  # "" is the whole server, as probes ask by default
# While runner work is in flight a watcher gets a fresh status at least this often, so a
# progress bar's elapsed time and estimate move during one long step (a 90 s JIT compile).
HEARTBEAT_S = 1.0
# wait_runner_idle polls the worker's flag: only a shutdown waits on it, and 50 ms is nothing
# against its grace period.
IDLE_POLL_S = 0.05


class WarmupCancelled(BaseException):
    """Raised into the warmup (through its progress callback) when the server stops.

    A BaseException, like asyncio.CancelledError: the plan's `except Exception` records a
    failed phase with a traceback, and a stop is neither a failure nor worth a traceback.
    """


class WarmupController:
    def __init__(self, engine: WarmupEngine, identity: Identity, *, max_num_batched_tokens: int,
                 default_mixed_num_tokens: int | None = None,
                 health: health_aio.HealthServicer | None = None,
                 metrics: Metrics | None = None,
                 plan_phases: Sequence[str] = PLAN_PHASES,
                 jit_monitor: JitMonitor | None = None, strict_jit: str = "warn") -> None:
        self._engine = engine
        self._budget = max_num_batched_tokens
        self._default_mixed = default_mixed_num_tokens
        self._health = health
        self._metrics = metrics
        self._plan_phases = tuple(plan_phases)
        self._identity = identity
        self._tracker = StatusTracker(
            identity, cache_info=getattr(engine, "compile_cache_info", None))
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="warmgate-runner")
        self._lock = asyncio.Lock()
        self._plans: SingleFlight[int | None, WarmupReport] = SingleFlight(lambda r: r.succeeded)
        self._mixed: SingleFlight[int, WarmupReport] = SingleFlight(lambda r: r.succeeded)
        # Checked by the worker between steps; a Python thread cannot be interrupted otherwise.
        self._cancel = threading.Event()
        self._closing = False
        # Set by begin_drain (SIGTERM): warmups are refused while Generate streams finish.
        self._draining = False
        self._background: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        # Set by the worker thread while it runs a job, which close() cannot interrupt.
        self._runner_busy = threading.Event()
        self._fatal: BaseException | None = None
        self._fatal_event = asyncio.Event()
        self._jobs_waiting = 0
        # The kind of warmup ("plan", "mixed") on the worker now, for close()'s log line.
        self._warming: str | None = None
        self._serving = False
        # Called on the event loop just before health turns SERVING (see add_ready_listener).
        self._ready_listeners: list[Callable[[], None]] = []
        # Ready once a plan succeeded; every compile it sees from then on is traffic's.
        self._jit = jit_monitor
        if jit_monitor is not None:
            if metrics is not None:
                jit_monitor.add_listener(metrics.observe_jit)
            jit_monitor.add_listener(StrictJitPolicy(strict_jit, self._jit_failed_threadsafe))

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self, *, warmup_on_start: bool) -> None:
        """Load the model in the background and, if asked, run the plan after it."""
        self._loop = asyncio.get_running_loop()
        await self._set_serving(False)
        self._spawn(self._load())
        if warmup_on_start:
            self._spawn(self._warm_on_start())

    def begin_drain(self) -> None:
        """Shutdown started: refuse warmups from now on (UNAVAILABLE, like Generate), so none
        preempts the streams the grace period is for; running streams keep the runner."""
        self._draining = True

    async def close(self, *, wait: bool = False) -> None:
        """Stop taking work, abort the run in progress at its next step, end watches."""
        if not self._closing and self._warming is not None:
            snap = self._tracker.snapshot()
            # A stop, not a failure: one INFO line here, nothing from the run it cancels.
            logger.info("warmup cancelled: the server is shutting down (the %s warmup stops at "
                        "its next step; last progress: phase %s, step %d/%d)", self._warming,
                        snap.current_phase or "-", snap.steps_done, snap.steps_total)
        self._closing = True
        self._cancel.set()
        self._tracker.notify()
        for task in list(self._background):
            task.cancel()
        if wait:  # tests: leave no runner thread behind
            await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)
        else:
            self._executor.shutdown(wait=False, cancel_futures=True)

    @property
    def fatal_error(self) -> BaseException | None:
        """The unrecoverable device error that took the server down, if one did."""
        return self._fatal

    async def wait_fatal(self) -> BaseException:
        """Return once a fatal device error happened (main then exits non-zero)."""
        await self._fatal_event.wait()
        assert self._fatal is not None  # set before the event; an invariant, not input
        return self._fatal

    async def device_lost(self, exc: BaseException) -> None:
        """A sticky CUDA error: NOT_SERVING for good, take no more work, tell main to exit.

        Every health service, "liveness" included, turns NOT_SERVING through
        enter_graceful_shutdown, after which no set() can turn it back: a process whose CUDA
        context is gone must never look healthy again.
        """
        if self._fatal is not None:
            return
        phase = exc.phase if isinstance(exc, FatalDeviceError) else "rpc"
        cause = exc.cause if isinstance(exc, FatalDeviceError) else exc
        logger.critical("%s", describe_fatal(phase, cause))
        self._fatal = exc
        self._closing = True
        self._cancel.set()
        self._tracker.fail(describe_fatal(phase, cause))
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        if self._metrics is not None:
            self._metrics.ready.set(0)
        self._observe_state()
        self._fatal_event.set()

    @property
    def runner_busy(self) -> bool:
        return self._runner_busy.is_set()

    async def wait_runner_idle(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the worker to finish its step; False if it did not."""
        deadline = time.monotonic() + timeout
        while self._runner_busy.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(IDLE_POLL_S)
        return not self._runner_busy.is_set()

    # -- the RPCs' domain calls ---------------------------------------------------------

    async def warmup_kernels(self, *, force: bool = False, mixed_num_tokens: int | None = None
                             ) -> Shared[WarmupReport]:
        self._check_accepting_warmups()
        if mixed_num_tokens is not None:
            self._check_num_tokens("mixed_num_tokens", mixed_num_tokens)
        key = self._default_mixed if mixed_num_tokens is None else mixed_num_tokens
        return await self._plans.run(key, lambda: self._run_plan(key, force), force=force)

    async def mixed_warmup(self, num_tokens: int, *, force: bool = False
                           ) -> Shared[WarmupReport]:
        self._check_accepting_warmups()
        self._check_num_tokens("num_tokens", num_tokens)
        return await self._mixed.run(num_tokens, lambda: self._run_mixed(num_tokens),
                                     force=force)

    def status(self) -> StatusSnapshot:
        """The tracker's snapshot plus what only the controller knows: why health is not
        SERVING, and the CUDA-graph misses serving has hit since ready."""
        misses = self._jit.snapshot().graph_misses_after_ready if self._jit is not None else 0
        return with_readiness(self._tracker.snapshot(), serving=self._serving,
                              shutting_down=self._closing or self._draining,
                              graph_misses_after_ready=misses)

    async def watch(self, *, follow: bool = False) -> AsyncIterator[StatusSnapshot]:
        """The status now, then after every change; ends once settled unless following."""
        seen = -1
        while not self._closing:
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

    # -- jobs ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closing:
            raise ShuttingDown()

    def _check_accepting_warmups(self) -> None:
        if self._closing or self._draining:
            raise ShuttingDown()

    def _check_num_tokens(self, field: str, value: int) -> None:
        if value < 0:
            raise InvalidArgument(FieldViolation(field, f"must be >= 0, got {value}"))
        if value > self._budget:
            raise InvalidArgument(FieldViolation(
                field, f"{value} is more than max_num_batched_tokens ({self._budget}); a step "
                       "cannot hold more tokens than the server's batch budget"))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    @contextlib.asynccontextmanager
    async def _job(self) -> AsyncIterator[None]:
        """One runner job: counted as in flight while queued, run alone under the lock.

        While it waits, `jobs_waiting` tells the serving loop to pause at its next step."""
        self._tracker.job_queued()
        self._jobs_waiting += 1
        waiting = True
        try:
            async with self._lock:
                self._jobs_waiting -= 1
                waiting = False
                self._check_open()
                yield
        finally:
            if waiting:  # cancelled before it got the lock
                self._jobs_waiting -= 1
            self._tracker.job_done()

    # -- serving ------------------------------------------------------------------------

    @property
    def jobs_waiting(self) -> int:
        """Runner jobs (load, warmups) queued behind the lock; read from the worker thread."""
        return self._jobs_waiting

    @property
    def serving(self) -> bool:
        """Health is SERVING: a warmup plan succeeded and nothing has failed since."""
        return self._serving

    @property
    def model_loaded(self) -> bool:
        return self._engine.loaded

    def not_ready_reason(self) -> str:
        """Where the warmup stands, in a sentence, for an UNAVAILABLE answer."""
        return not_ready_sentence(self._tracker.snapshot(),
                                  shutting_down=self._closing or self._draining)

    async def run_serving(self, fn: Callable[[], None]) -> None:
        """fn (the serving loop) on the worker, between runner jobs; jobs queued meanwhile
        go first once fn returns (asyncio.Lock wakes waiters in order)."""
        async with self._lock:
            self._check_open()
            try:
                await self._in_worker(fn)
            except FatalDeviceError as exc:
                await self.device_lost(exc)
                raise ShuttingDown() from exc

    async def _in_worker(self, fn: Callable[[], T]) -> T:
        if self._loop is None:
            raise RuntimeError("WarmupController.start() was not called")
        busy = self._runner_busy

        def tracked() -> T:
            busy.set()
            try:
                return fn()
            finally:
                busy.clear()

        return await self._loop.run_in_executor(self._executor, tracked)

    async def _run_job(self, kind: str, fn: Callable[[], WarmupReport]) -> WarmupReport:
        """fn on the worker; whatever it raises becomes a FAILED report.

        A fatal device error also takes the server down (device_lost). A run that close()
        stopped at a step boundary is not a failure to report: its callers get UNAVAILABLE
        and retry elsewhere.
        """
        self._warming = kind
        try:
            report = await self._in_worker(fn)
        except WarmupCancelled:
            raise ShuttingDown() from None  # close() logged the cancellation
        except FatalDeviceError as exc:
            await self.device_lost(exc)
            return self._failed_report(exc.phase, describe_fatal(exc.phase, exc.cause))
        except Exception as exc:  # the plan reports failures itself; this is its bug
            logger.exception("the %s warmup raised", kind)
            report = self._failed_report(kind, f"{type(exc).__name__}: {exc}")
        finally:
            self._warming = None
        if self._cancel.is_set():
            raise ShuttingDown()
        return report

    def _progress(self, event: ProgressEvent) -> None:
        """Called on the worker thread after every step."""
        if self._cancel.is_set():
            raise WarmupCancelled("the server is shutting down")
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed under us: nobody listens
                loop.call_soon_threadsafe(self._tracker.progress, event)

    async def _load(self) -> None:
        async with self._job():
            self._tracker.begin("load", ("load",))
            self._tracker.progress(ProgressEvent("load", 0, 1))
            try:
                phase = await self._in_worker(self._engine.load)
            except FatalDeviceError as exc:
                phase = PhaseResult(name="load", status=PhaseStatus.FAILED,
                                    detail=describe_fatal("load", exc.cause))
                await self.device_lost(exc)
            self._tracker.end_load(phase)
            self._observe_state()
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

    async def _run_plan(self, mixed_num_tokens: int | None, force: bool) -> WarmupReport:
        async with self._job():
            self._check_accepting_warmups()  # a drain may have begun while this one queued
            self._require_loaded()
            self._tracker.begin("plan", self._plan_phases, previous=self._tracker.last_report)
            if self._serving:
                # A re-warmup preempts every stream and recompiles: not ready until it ends.
                logger.info("re-warmup: health NOT_SERVING until the plan ends")
                await self._set_serving(False)
            self._observe_state()
            if self._jit is not None:
                self._jit.mark_not_ready()  # what this plan compiles is the plan's own work
            try:
                report = await self._run_job("plan", lambda: self._engine.run_plan(
                    mixed_num_tokens=mixed_num_tokens, force=force, progress=self._progress))
            except ShuttingDown:
                self._tracker.end_other()
                raise
            self._tracker.end_plan(report)
            if not report.succeeded:
                self._plans.forget()  # a stored success no longer describes the runner
            elif self._jit is not None:
                self._jit.mark_ready()  # before SERVING: no compile slips in untagged
            await self._set_serving(report.succeeded)
            self._observe(report)
            return report

    async def _run_mixed(self, num_tokens: int) -> WarmupReport:
        async with self._job():
            self._check_accepting_warmups()
            self._require_loaded()
            self._tracker.begin("mixed", MIXED_PHASES, previous=self._mixed.stored(num_tokens))
            was_serving = self._serving
            if was_serving:
                # It preempts every stream like a re-warmup: not ready until it ends.
                logger.info("mixed warmup: health NOT_SERVING until it ends")
                await self._set_serving(False)
            try:
                report = await self._run_job("mixed", lambda: self._engine.run_mixed(
                    num_tokens, progress=self._progress))
            finally:
                self._tracker.end_other()
            self._observe(report)
            if was_serving and not report.succeeded:
                failed = "; ".join(p.detail for p in report.phases
                                   if p.status is PhaseStatus.FAILED)
                self._lose_readiness(f"mixed warmup ({num_tokens} tokens) failed: {failed}")
            elif was_serving and self._tracker.state is WarmupState.READY:
                await self._set_serving(True)  # unless something failed meanwhile
            return report

    def _require_loaded(self) -> None:
        if not self._engine.loaded:
            reason = self._tracker.snapshot().failure_reason or "the model is not loaded"
            raise FailedPrecondition("model", f"{reason}; fix the configuration and restart")

    def _failed_report(self, name: str, detail: str) -> WarmupReport:
        phase = PhaseResult(name=name, status=PhaseStatus.FAILED, detail=detail)
        log_phase(phase)  # the plan never saw this failure
        i = self._identity
        return WarmupReport(WarmupOutcome.FAILED, [phase], 0.0, i.config_hash, device=i.device,
                            attention_backend=i.attention_backend, model=i.model)

    # -- readiness and metrics ----------------------------------------------------------

    def _jit_failed_threadsafe(self, reason: str) -> None:
        """--strict-jit=fail saw a compile after ready; called on the compiling thread."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: the server is gone
                loop.call_soon_threadsafe(self._jit_failed, reason)

    def _jit_failed(self, reason: str) -> None:
        """FAILED with the compile's batch as the reason, and NOT_SERVING."""
        self._lose_readiness(reason)

    def _lose_readiness(self, reason: str) -> None:
        """FAILED for `reason`, and NOT_SERVING. Not fatal: a forced WarmupKernels warms
        again and, if it succeeds, turns health SERVING."""
        if self._fatal is not None or self._tracker.state is WarmupState.FAILED:
            return  # the first reason stands
        self._tracker.fail(reason)
        self._plans.forget()  # a stored success no longer describes the runner
        self._spawn(self._set_serving(False))

    def add_ready_listener(self, fn: Callable[[], None]) -> None:
        """fn() on the event loop each time a plan succeeds, before health turns SERVING:
        for set-up the first request would otherwise pay for (the serving loop's KV block
        pool). An exception is logged, and readiness goes on without it."""
        self._ready_listeners.append(fn)

    async def _set_serving(self, serving: bool) -> None:
        if serving:
            for fn in self._ready_listeners:
                try:
                    fn()
                except Exception:
                    logger.exception("a ready listener failed; the first request pays for "
                                     "what it would have prepared")
        self._serving = serving
        if self._health is not None:
            status = (health_pb2.HealthCheckResponse.SERVING if serving
                      else health_pb2.HealthCheckResponse.NOT_SERVING)
            for name in SERVICE_NAMES:
                await self._health.set(name, status)  # a coroutine: un-awaited it does nothing
        if self._metrics is not None:
            self._metrics.ready.set(1 if serving else 0)
        self._observe_state()

    def _observe_state(self) -> None:
        if self._metrics is not None:
            self._metrics.set_state(self._tracker.state.value)

    def _observe(self, report: WarmupReport) -> None:
        log_report(report)
        if self._metrics is not None:
            self._metrics.observe_report(report)
