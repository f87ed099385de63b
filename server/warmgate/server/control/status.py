"""What GetStatus and WatchStatus report: the warmup state machine and the run in progress.

States: PENDING -> RUNNING -> READY | FAILED (a forced re-warmup goes READY -> RUNNING again).
Only the warmup plan moves the state; a mixed warmup shows as progress without changing it,
and a failed model load goes straight to FAILED. Every method runs on the event loop thread
(progress from the worker arrives through loop.call_soon_threadsafe), so there is no lock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from warmgate.server.control.eta import estimate_remaining
from warmgate.server.core.progress import ProgressEvent
from warmgate.server.core.results import PhaseResult, PhaseStatus, WarmupReport


class WarmupState(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    READY = "ready"
    FAILED = "failed"


@dataclass(frozen=True)
class Identity:
    """What the runner is: fixed for the server's lifetime."""

    config_hash: str
    model: str
    device: str
    attention_backend: str
    # --deterministic (batch-invariant kernels).
    deterministic: bool = False


@dataclass(frozen=True)
class StatusSnapshot:
    state: WarmupState
    identity: Identity
    current_phase: str = ""
    steps_done: int = 0
    steps_total: int = 0
    phase_index: int = 0
    num_phases: int = 0
    elapsed_s: float = 0.0
    estimated_remaining_s: float | None = None
    last_report: WarmupReport | None = None
    failure_reason: str = ""
    work_in_flight: bool = False
    # The --cache-dir entry (CacheInfo.to_dict()), once the model load opened it.
    compile_cache: dict[str, Any] | None = None
    # Filled in by the controller, which owns readiness and the JIT monitor.
    cuda_graph_misses_after_ready: int = 0
    not_serving_reason: str = ""

    @property
    def settled(self) -> bool:
        """Nothing will change unless someone asks: the end of a non-following watch."""
        return self.state in (WarmupState.READY, WarmupState.FAILED) and not self.work_in_flight


@dataclass
class _Run:
    kind: str  # "load", "plan" or "mixed"
    phases: tuple[str, ...]
    started_at: float
    # Per-phase seconds of an earlier run of the same kind, for the estimate.
    previous_s: dict[str, float]
    current: str = ""
    steps_done: int = 0
    steps_total: int = 0
    phase_index: int = 0
    phase_started_at: float = 0.0
    finished_s: dict[str, float] = field(default_factory=dict)


def phase_seconds(report: WarmupReport | None) -> dict[str, float]:
    if report is None:
        return {}
    return {p.name: p.duration_s for p in report.phases if p.status is PhaseStatus.RAN}


class StatusTracker:
    def __init__(self, identity: Identity, *, clock: Callable[[], float] = time.monotonic,
                 cache_info: Callable[[], dict[str, Any] | None] | None = None) -> None:
        self._identity = identity
        self._cache_info = cache_info
        self._clock = clock
        self._state = WarmupState.PENDING
        self._failure_reason = ""
        self._last_report: WarmupReport | None = None
        self._run: _Run | None = None
        self._last_run_s = 0.0
        self._waiting = 0  # jobs queued or running on the worker
        self.version = 0
        # Replaced on every change: a watcher waits on the one that was current when it last
        # looked, so changes coalesce and a slow watcher never queues anything.
        self._changed = asyncio.Event()

    @property
    def state(self) -> WarmupState:
        return self._state

    @property
    def last_report(self) -> WarmupReport | None:
        return self._last_report

    @property
    def work_in_flight(self) -> bool:
        return self._waiting > 0

    def notify(self) -> None:
        self.version += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_change(self, seen_version: int) -> None:
        if self.version == seen_version:
            await self._changed.wait()

    def job_queued(self) -> None:
        self._waiting += 1
        self.notify()

    def job_done(self) -> None:
        self._waiting -= 1
        self.notify()

    def begin(self, kind: str, phases: Sequence[str],
              previous: WarmupReport | None = None) -> None:
        now = self._clock()
        self._run = _Run(kind=kind, phases=tuple(phases), started_at=now,
                         previous_s=phase_seconds(previous), phase_started_at=now)
        if kind == "plan":
            self._state = WarmupState.RUNNING
            self._failure_reason = ""
        self.notify()

    def progress(self, event: ProgressEvent) -> None:
        run = self._run
        # The plan repeats a phase's final event after a combined step; a finished phase
        # never becomes current again.
        if run is None or event.phase in run.finished_s:
            return
        now = self._clock()
        if event.phase != run.current:
            run.current = event.phase
            run.phase_index = (run.phases.index(event.phase) if event.phase in run.phases
                               else event.phase_index)
        run.steps_done, run.steps_total = event.steps_done, event.steps_total
        if event.steps_total > 0 and event.steps_done >= event.steps_total:
            run.finished_s[event.phase] = now - run.phase_started_at
            run.phase_started_at = now
        self.notify()

    def end_load(self, phase: PhaseResult) -> None:
        self._end()
        if phase.status is PhaseStatus.FAILED:
            self._state = WarmupState.FAILED
            self._failure_reason = f"the model failed to load: {phase.detail}"
        self.notify()

    def end_plan(self, report: WarmupReport) -> None:
        self._end()
        self._last_report = report
        if report.succeeded:
            self._state, self._failure_reason = WarmupState.READY, ""
        else:
            self._state = WarmupState.FAILED
            failed = [p for p in report.phases if p.status is PhaseStatus.FAILED]
            self._failure_reason = "; ".join(f"{p.name}: {p.detail}" for p in failed) or \
                "the warmup plan failed"
        self.notify()

    def fail(self, reason: str) -> None:
        """FAILED for a reason outside any report (a fatal device error)."""
        self._state, self._failure_reason = WarmupState.FAILED, reason
        self.notify()

    def end_other(self) -> None:
        self._end()
        self.notify()

    def _end(self) -> None:
        if self._run is not None:
            self._last_run_s = self._clock() - self._run.started_at
        self._run = None

    def _compile_cache(self) -> dict[str, Any] | None:
        info = self._cache_info() if self._cache_info is not None else None
        return info if info and info.get("state") else None  # not opened yet: unset

    def snapshot(self) -> StatusSnapshot:
        idle = StatusSnapshot(state=self._state, identity=self._identity,
                              last_report=self._last_report, failure_reason=self._failure_reason,
                              work_in_flight=self.work_in_flight, elapsed_s=self._last_run_s,
                              compile_cache=self._compile_cache())
        run = self._run
        if run is None:
            return idle
        now = self._clock()
        eta = None
        if run.current:
            eta = estimate_remaining(phases=run.phases, current=run.current,
                                     steps_done=run.steps_done, steps_total=run.steps_total,
                                     phase_elapsed_s=now - run.phase_started_at,
                                     finished_s=run.finished_s, previous_s=run.previous_s)
        return dataclasses.replace(
            idle, current_phase=run.current, steps_done=run.steps_done,
            steps_total=run.steps_total, phase_index=run.phase_index,
            num_phases=len(run.phases), elapsed_s=now - run.started_at,
            estimated_remaining_s=eta)


def not_ready_sentence(snap: StatusSnapshot, *, shutting_down: bool) -> str:
    """Why the server is not ready, in a sentence: for UNAVAILABLE answers and GetStatus."""
    if shutting_down:
        return "the server is shutting down"
    text = f"the server is not ready: warmup state {snap.state.value.upper()}"
    if snap.state is WarmupState.READY and snap.work_in_flight:
        text += " and a warmup that preempts serving is running"
    if snap.current_phase:
        text += (f", phase {snap.current_phase} ({snap.phase_index + 1}/{snap.num_phases}, "
                 f"step {snap.steps_done}/{snap.steps_total})")
    if snap.failure_reason:
        text += f": {snap.failure_reason}"
    return text


def with_readiness(snap: StatusSnapshot, *, serving: bool, shutting_down: bool,
                   graph_misses_after_ready: int) -> StatusSnapshot:
    """The snapshot with what the controller knows beside the tracker: health's reason for
    NOT_SERVING (empty while SERVING) and the CUDA-graph misses after ready."""
    reason = "" if serving else not_ready_sentence(snap, shutting_down=shutting_down)
    return dataclasses.replace(snap, not_serving_reason=reason,
                               cuda_graph_misses_after_ready=graph_misses_after_ready)
