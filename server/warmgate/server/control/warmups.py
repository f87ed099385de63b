"""The warmup entry points: a plan (first warmup or forced re-warmup) and a mixed warmup.

Each is single-flight per key (concurrent callers share one run; a kept success answers
later callers unless they force) and runs as one job on the runner worker. A run that
preempts serving turns readiness off until it ends.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from warmgate.server.control.engine import WarmupEngine
from warmgate.server.control.heap_freeze import thaw_warm_heap
from warmgate.server.control.readiness import Readiness, WarmupMetrics
from warmgate.server.control.singleflight import Shared, SingleFlight
from warmgate.server.control.status import Identity, StatusTracker, WarmupState
from warmgate.server.control.worker import RunnerWorker, WarmupCancelled
from warmgate.server.core.errors import (
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    ShuttingDown,
)
from warmgate.server.core.failures import FatalDeviceError, describe_fatal
from warmgate.server.core.phases import MIXED_PHASES, SERVING_REHEARSAL
from warmgate.server.core.results import PhaseResult, PhaseStatus, WarmupOutcome, WarmupReport
from warmgate.server.jit import JitMonitor
from warmgate.server.telemetry.report_log import log_phase, log_report

logger = logging.getLogger(__name__)


class WarmupRuns:
    def __init__(self, engine: WarmupEngine, identity: Identity, *, worker: RunnerWorker,
                 tracker: StatusTracker, readiness: Readiness, max_num_batched_tokens: int,
                 default_mixed_num_tokens: int | None, plan_phases: Sequence[str],
                 jit_monitor: JitMonitor | None, metrics: WarmupMetrics | None,
                 on_fatal: Callable[[BaseException], Awaitable[None]]) -> None:
        self._engine = engine
        self._identity = identity
        self._worker = worker
        self._tracker = tracker
        self._readiness = readiness
        self._budget = max_num_batched_tokens
        self._default_mixed = default_mixed_num_tokens
        self._plan_phases = tuple(plan_phases)
        self._jit = jit_monitor
        self._metrics = metrics
        self._on_fatal = on_fatal  # takes the server down (WarmupController.device_lost)
        self._plans: SingleFlight[int | None, WarmupReport] = SingleFlight(lambda r: r.succeeded)
        self._mixed: SingleFlight[int, WarmupReport] = SingleFlight(lambda r: r.succeeded)
        # Set by begin_drain (SIGTERM): warmups are refused while Generate streams finish.
        self._draining = False
        # The kind of warmup ("plan", "mixed") on the worker now, for the stop's log line.
        self.warming: str | None = None
        # A stored success no longer describes the runner once readiness is lost.
        readiness.add_lost_hook(self._plans.forget)
        # Requests through the serving path, run once before health first turns SERVING
        # (GenerationService.rehearse; set by the app).
        self.rehearsal: Callable[[], Awaitable[None]] | None = None
        self._rehearsed = False

    @property
    def draining(self) -> bool:
        return self._draining

    def begin_drain(self) -> None:
        self._draining = True

    async def warmup_kernels(self, *, force: bool = False, mixed_num_tokens: int | None = None
                             ) -> Shared[WarmupReport]:
        self._check_accepting()
        if mixed_num_tokens is not None:
            self._check_num_tokens("mixed_num_tokens", mixed_num_tokens)
        key = self._default_mixed if mixed_num_tokens is None else mixed_num_tokens
        return await self._plans.run(key, lambda: self._run_plan(key, force), force=force)

    async def mixed_warmup(self, num_tokens: int, *, force: bool = False
                           ) -> Shared[WarmupReport]:
        self._check_accepting()
        self._check_num_tokens("num_tokens", num_tokens)
        return await self._mixed.run(num_tokens, lambda: self._run_mixed(num_tokens),
                                     force=force)

    def _check_accepting(self) -> None:
        if self._worker.closing or self._draining:
            raise ShuttingDown()

    def _check_num_tokens(self, field: str, value: int) -> None:
        if value < 0:
            raise InvalidArgument(FieldViolation(field, f"must be >= 0, got {value}"))
        if value > self._budget:
            raise InvalidArgument(FieldViolation(
                field, f"{value} is more than max_num_batched_tokens ({self._budget}); a step "
                       "cannot hold more tokens than the server's batch budget"))

    def _require_loaded(self) -> None:
        if not self._engine.loaded:
            reason = self._tracker.snapshot().failure_reason or "the model is not loaded"
            raise FailedPrecondition("model", f"{reason}; fix the configuration and restart")

    async def _run_plan(self, mixed_num_tokens: int | None, force: bool) -> WarmupReport:
        async with self._worker.job():
            self._check_accepting()  # a drain may have begun while this one queued
            self._require_loaded()
            self._tracker.begin("plan", self._plan_phases, previous=self._tracker.last_report)
            if self._readiness.serving:
                # A re-warmup preempts every stream and recompiles: not ready until it ends.
                logger.info("re-warmup: health NOT_SERVING until the plan ends")
                await self._readiness.set_serving(False)
            self._readiness.observe_state()
            thaw_warm_heap(self._engine.runner)  # the graphs it replaces may be in cycles
            if self._jit is not None:
                self._jit.mark_not_ready()  # what this plan compiles is the plan's own work
            progress = self._worker.progress_to(self._tracker.progress)
            try:
                report = await self._run_job("plan", lambda: self._engine.run_plan(
                    mixed_num_tokens=mixed_num_tokens, force=force, progress=progress))
            except ShuttingDown:
                self._tracker.end_other()
                raise
            if self._jit is not None and report.succeeded:
                self._jit.mark_ready()  # before SERVING: no compile slips in untagged
        if report.succeeded:
            # Out of the job: the rehearsal's requests run on the worker between jobs. The
            # plan stays RUNNING in GetStatus meanwhile, so READY comes with SERVING.
            report = await self._rehearse(report)
        self._tracker.end_plan(report)
        if not report.succeeded:
            self._plans.forget()  # a stored success no longer describes the runner
        await self._readiness.set_serving(report.succeeded)
        self._observe(report)
        return report

    async def _rehearse(self, report: WarmupReport) -> WarmupReport:
        """The serving rehearsal, the first time a plan succeeds: the report, FAILED with a
        serving_rehearsal phase when it failed or readiness was lost while it ran."""
        if self.rehearsal is None or self._rehearsed:
            return report
        start = time.perf_counter()
        try:
            await self.rehearsal()
        except ShuttingDown:
            self._tracker.end_plan(report)
            raise
        except Exception as exc:
            logger.exception("the serving rehearsal failed")
            failure = f"{type(exc).__name__}: {exc}"
        else:
            if self._tracker.state is not WarmupState.FAILED:
                self._rehearsed = True
                return report
            # Lost while it ran: a compile under --strict-jit fail, a device error.
            failure = self._tracker.snapshot().failure_reason
        phase = PhaseResult(SERVING_REHEARSAL, PhaseStatus.FAILED, time.perf_counter() - start,
                            detail=f"requests through Generate before health turns SERVING "
                                   f"failed: {failure}")
        return dataclasses.replace(report, outcome=WarmupOutcome.FAILED,
                                   phases=[*report.phases, phase])

    async def _run_mixed(self, num_tokens: int) -> WarmupReport:
        async with self._worker.job():
            self._check_accepting()
            self._require_loaded()
            self._tracker.begin("mixed", MIXED_PHASES, previous=self._mixed.stored(num_tokens))
            was_serving = self._readiness.serving
            if was_serving:
                # It preempts every stream like a re-warmup: not ready until it ends.
                logger.info("mixed warmup: health NOT_SERVING until it ends")
                await self._readiness.set_serving(False)
            thaw_warm_heap(self._engine.runner)
            progress = self._worker.progress_to(self._tracker.progress)
            try:
                report = await self._run_job("mixed", lambda: self._engine.run_mixed(
                    num_tokens, progress=progress))
            finally:
                self._tracker.end_other()
            self._observe(report)
            if was_serving and not report.succeeded:
                failed = "; ".join(p.detail for p in report.phases
                                   if p.status is PhaseStatus.FAILED)
                self._readiness.lose(f"mixed warmup ({num_tokens} tokens) failed: {failed}")
            elif was_serving and self._tracker.state is WarmupState.READY:
                await self._readiness.set_serving(True)  # unless something failed meanwhile
            return report

    async def _run_job(self, kind: str, run: Callable[[], WarmupReport]) -> WarmupReport:
        """`run` on the worker; whatever it raises becomes a FAILED report.

        A fatal device error also takes the server down (on_fatal). A run that
        a stop cut at a step boundary is not a failure to report: its callers get
        UNAVAILABLE and retry elsewhere.
        """
        self.warming = kind
        try:
            report = await self._worker.run(run)
        except WarmupCancelled:
            raise ShuttingDown() from None  # the stop logged the cancellation
        except FatalDeviceError as exc:
            await self._on_fatal(exc)
            return self._failed_report(exc.phase, describe_fatal(exc.phase, exc.cause))
        except Exception as exc:  # the plan reports failures itself; this is its bug
            logger.exception("the %s warmup raised", kind)
            report = self._failed_report(kind, f"{type(exc).__name__}: {exc}")
        finally:
            self.warming = None
        if self._worker.cancelled:
            raise ShuttingDown()
        return report

    def _failed_report(self, name: str, detail: str) -> WarmupReport:
        phase = PhaseResult(name=name, status=PhaseStatus.FAILED, detail=detail)
        log_phase(phase)  # the plan never saw this failure
        i = self._identity
        return WarmupReport(WarmupOutcome.FAILED, [phase], 0.0, i.config_hash, device=i.device,
                            attention_backend=i.attention_backend, model=i.model,
                            deterministic=i.deterministic)

    def _observe(self, report: WarmupReport) -> None:
        log_report(report)
        if self._metrics is not None:
            self._metrics.observe_report(report)
