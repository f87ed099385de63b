"""Running the plan's steps in order: progress stamped with each phase's place, compiles
billed to the phase that ran, a failure recorded as data and the rest skipped."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from warmgate.server.core.failures import (
    FatalDeviceError,
    describe_failure,
    is_fatal_device_error,
)
from warmgate.server.core.progress import ProgressCallback, ProgressEvent
from warmgate.server.core.results import PhaseResult, PhaseStatus, SkipReason
from warmgate.server.jit import JitMonitor
from warmgate.server.telemetry.report_log import log_phase
from warmgate.server.warmup.compile_ledger import PhaseLedger

logger = logging.getLogger(__name__)


class PlanProgress:
    """Stamps events with the phase's place in the plan, remembers which phases spoke and
    keeps each sub-phase's result as it ends (phase_done), with the time it ended."""

    def __init__(self, progress: ProgressCallback | None, names: tuple[str, ...],
                 ledger: PhaseLedger) -> None:
        self._progress = progress
        self._names = names
        self.ledger = ledger
        self.seen: set[str] = set()
        # Results of the current step's sub-phases that ended, and when the last one did.
        self.completed: dict[str, PhaseResult] = {}
        self.last_end = time.perf_counter()

    def begin_step(self) -> None:
        self.completed = {}
        self.last_end = time.perf_counter()

    def phase_done(self, result: PhaseResult) -> None:
        self.completed[result.name] = result
        self.last_end = time.perf_counter()

    def __call__(self, e: ProgressEvent) -> None:
        self.seen.add(e.phase)
        self.ledger.charge(e.phase)
        if self._progress is not None:
            index = self._names.index(e.phase) if e.phase in self._names else 0
            self._progress(ProgressEvent(e.phase, e.steps_done, e.steps_total, index,
                                         len(self._names)))


# A step runs one or more named phases, reporting step progress (and, when it has several
# sub-phases, each one's result as it ends) through the tracker it gets.
Step = tuple[tuple[str, ...], Callable[[PlanProgress], list[PhaseResult]]]


def failed_step(step_names: tuple[str, ...], tracker: PlanProgress,
                 exc: Exception) -> list[PhaseResult]:
    """The step's results after `exc`: the sub-phases that ended keep their own results
    and seconds; the first that had not ended failed, with the time since the last ended."""
    culprit = next((n for n in step_names if n not in tracker.completed), step_names[-1])
    logger.error("phase %s failed", culprit, exc_info=exc)
    tracker.ledger.charge(culprit)
    if is_fatal_device_error(exc):
        # Not a phase failure: the CUDA context is gone, no later phase can run, and the
        # process has to exit; the controller decides how.
        raise FatalDeviceError(culprit, exc) from exc
    at = step_names.index(culprit)
    produced = [tracker.completed[n] for n in step_names[:at]]
    produced.append(PhaseResult(name=culprit, status=PhaseStatus.FAILED,
                                duration_s=time.perf_counter() - tracker.last_end,
                                detail=describe_failure(culprit, exc)))
    produced += [PhaseResult.skipped(n, SkipReason.EARLIER_PHASE_FAILED,
                                     "not run: an earlier phase failed")
                 for n in step_names[at + 1:]]
    return produced


def run_phases(steps: list[Step], progress: ProgressCallback | None,
                names: tuple[str, ...], monitor: JitMonitor | None = None) -> list[PhaseResult]:
    """Run each step, which yields the phases it names; after a failure the rest are skipped.

    Phases that reported no step progress of their own (skips, single-shot phases) get one
    completion event, so a watcher sees every phase go by in order.
    """
    tracker = PlanProgress(progress, names, PhaseLedger(monitor))
    results: list[PhaseResult] = []
    failed = False
    for step_names, step in steps:
        if failed:
            results += [PhaseResult.skipped(n, SkipReason.EARLIER_PHASE_FAILED,
                                            "not run: an earlier phase failed")
                        for n in step_names]
            continue
        tracker.begin_step()
        try:
            produced = step(tracker)
            # What ran after the step's last progress event (its clean-up) is its last phase's.
            tracker.ledger.charge(step_names[-1])
        except Exception as exc:  # a phase failure is data; the caller decides what is fatal
            produced = failed_step(step_names, tracker, exc)
        failed = any(p.status is PhaseStatus.FAILED for p in produced)
        for p in produced:
            tracker.ledger.fill(p)
            log_phase(p)
            if p.status is not PhaseStatus.FAILED and p.name not in tracker.seen:
                tracker(ProgressEvent(p.name, 1, 1))
        results += produced
    return results
