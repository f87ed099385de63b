"""The test-only fault injector: fires the faults of config.faults' spec from the worker
thread, in the phase each names (see warmgate.server.config.faults for the spec)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from warmgate.server.config.faults import Fault
from warmgate.server.core.phases import RUNNER_CALL_PHASES
from warmgate.server.core.progress import ProgressCallback, ProgressEvent
from warmgate.server.runner.scheduler_output import SchedulerOutput

if TYPE_CHECKING:  # warmup's package imports the torch-heavy plan; the checker only needs this
    from warmgate.server.jit import JitMonitor
    from warmgate.server.warmup.runner_contract import WarmupRunner

P = ParamSpec("P")
R = TypeVar("R")

logger = logging.getLogger(__name__)


class FaultInjector:
    """Fires faults from the worker thread; every method runs there, so no lock."""

    def __init__(self, faults: Sequence[Fault]) -> None:
        self._armed = list(faults)
        self._run_phases: tuple[str, ...] = ()
        self._finished: set[str] = set()
        self._entered: set[str] = set()
        self.fired: list[Fault] = []  # for tests and logs
        self._jit: JitMonitor | None = None  # the wrapped runner's, for the jit kind

    def start_run(self, phases: Sequence[str] = RUNNER_CALL_PHASES) -> None:
        self._run_phases = tuple(p for p in phases if p in RUNNER_CALL_PHASES)
        self._finished, self._entered = set(), set()

    def watching(self, progress: ProgressCallback) -> ProgressCallback:
        """Forward the run's progress, noting which phases have finished."""

        def observe(event: ProgressEvent) -> None:
            if event.steps_total > 0 and event.steps_done >= event.steps_total:
                self._finished.add(event.phase)
            progress(event)

        return observe

    def wrap_runner(self, runner: WarmupRunner) -> None:
        """Route the runner's two callbacks (what every warmup step calls) through `enter`:
        instance attributes of the same names shadow the methods."""
        self._jit = getattr(runner, "jit_monitor", None)
        for name in ("execute_model", "sample_tokens"):
            setattr(runner, name, self._guarded(getattr(runner, name)))

    def enter(self, phase: str) -> None:
        """Fire the faults armed for `phase`, once per run."""
        if phase in self._entered:
            return
        self._entered.add(phase)
        for fault in [f for f in self._armed if f.phase == phase]:
            self.fired.append(fault)
            logger.warning("injecting fault %s in phase %s", fault.kind, phase)
            if fault.kind == "delay":
                time.sleep(fault.delay_s)
                continue
            if fault.kind == "jit":
                if self._jit is not None:
                    self._jit.record("triton", name=f"injected fault in {phase}")
                continue
            self._armed.remove(fault)
            raise fault.exception()

    def _guarded(self, call: Callable[P, R]) -> Callable[P, R]:
        def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
            # The phase running now: the first of the run's phases that has not finished.
            current = next((p for p in self._run_phases if p not in self._finished), None)
            # A step that schedules nothing only frees the last phase's requests (its
            # `finally`); failing it would strand them in the runner, which no real error
            # in a phase's own work does.
            if current is not None and not _frees_only(args):
                self.enter(current)
            return call(*args, **kwargs)

        return guarded


def _frees_only(args: tuple[object, ...]) -> bool:
    """The call is an execute_model step that schedules nothing and only frees requests."""
    step = args[0] if args else None
    return (isinstance(step, SchedulerOutput) and step.total_num_scheduled_tokens == 0
            and bool(step.finished_req_ids))
