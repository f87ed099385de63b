"""Progress events the warmup emits after every step, for WatchStatus and CLIs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ProgressEvent:
    phase: str
    steps_done: int
    steps_total: int
    # Position of the phase in the plan (0-based) and the plan's length; 0 and 1 outside a plan.
    phase_index: int = 0
    num_phases: int = 1


ProgressCallback = Callable[[ProgressEvent], None]


class PhaseProgress:
    """Counts one phase's steps and reports each to an optional callback."""

    def __init__(self, phase: str, steps_total: int, callback: ProgressCallback | None,
                 phase_index: int = 0, num_phases: int = 1) -> None:
        self.phase = phase
        self.steps_total = steps_total
        self.steps_done = 0
        self._callback = callback
        self._phase_index = phase_index
        self._num_phases = num_phases

    def emit(self) -> None:
        if self._callback is not None:
            self._callback(ProgressEvent(self.phase, self.steps_done, self.steps_total,
                                         self._phase_index, self._num_phases))

    def step(self) -> None:
        self.steps_done += 1
        self.emit()
