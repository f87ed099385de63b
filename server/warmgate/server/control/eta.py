"""Estimated time to the end of a warmup run: a pure function, so it is easy to test."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def estimate_remaining(*, phases: Sequence[str], current: str, steps_done: int,
                       steps_total: int, phase_elapsed_s: float,
                       finished_s: Mapping[str, float],
                       previous_s: Mapping[str, float] | None = None) -> float | None:
    """Seconds left in a run of `phases`, `current` being the one in progress.

    A previous run of the same plan is the best guide (kernel JIT dominates and repeats per
    phase), so its per-phase durations are used where known. Otherwise the current phase is
    extrapolated from its own step rate and each later phase is assumed to take the mean of
    the phases already finished in this run. None when neither source says anything.
    """
    later = [p for p in phases[phases.index(current) + 1:]] if current in phases else []
    later = [p for p in later if p not in finished_s]
    previous_s = previous_s or {}

    current_left: float | None = None
    if current in previous_s:
        current_left = max(0.0, previous_s[current] - phase_elapsed_s)
    elif steps_done > 0 and steps_total >= steps_done:
        current_left = phase_elapsed_s / steps_done * (steps_total - steps_done)
    if current_left is None:
        return None

    mean_finished = sum(finished_s.values()) / len(finished_s) if finished_s else None
    later_s = 0.0
    for name in later:
        if name in previous_s:
            later_s += previous_s[name]
        elif mean_finished is not None:
            later_s += mean_finished
        else:
            return None
    return current_left + later_s
