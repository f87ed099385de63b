"""Test-only fault injection: make a chosen warmup phase raise or stall, on demand.

Off unless `WARMGATE_FAULT_INJECT` is set (read once, by load_server_config) or a test hands
a FaultInjector to PlanEngine. The spec is a comma-separated list of `phase:kind`:

  oom          torch.OutOfMemoryError, as a failed CUDA allocation raises it
  compile      a kernel compilation error (named like triton's CompilationError)
  cuda_fatal   RuntimeError("CUDA error: an illegal memory access was encountered")
  delay=S      sleep S seconds, to hold a warmup open (shutdown and cancellation tests)

e.g. `WARMGATE_FAULT_INJECT=kernels.decode:oom` or `mixed:delay=2,kernels.sampler:compile`.
A fault fires at the first runner call of its phase in a run, so the plan's own bookkeeping
blames the right phase. Raising faults fire once, so a test can show that a retry recovers;
a delay fires in every run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from warmgate.server.core.progress import ProgressCallback, ProgressEvent

logger = logging.getLogger(__name__)

ENV_VAR = "WARMGATE_FAULT_INJECT"
# The phases whose work goes through the runner's callbacks, in the order a plan runs them;
# "load" fires before the runner is built. flashinfer and cuda_graphs are not here: on a CPU
# they skip, so a fault there could never fire.
RUN_PHASES = ("kernels.prefill", "kernels.decode", "kernels.sampler", "mixed")
FAULT_PHASES = ("load", *RUN_PHASES)
RAISING_KINDS = ("oom", "compile", "cuda_fatal")
MAX_DELAY_S = 600.0


class CompilationError(RuntimeError):
    """Stands in for triton.compiler.errors.CompilationError (matched by class name)."""


@dataclass(frozen=True)
class Fault:
    phase: str
    kind: str  # one of RAISING_KINDS, or "delay"
    delay_s: float = 0.0

    def exception(self) -> Exception:
        if self.kind == "oom":
            import torch

            return torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB (injected fault)")
        if self.kind == "compile":
            return CompilationError("at 12:4: incompatible types in the kernel (injected fault)")
        return RuntimeError("CUDA error: an illegal memory access was encountered "
                            "(injected fault)")


def parse_faults(spec: str) -> tuple[Fault, ...]:
    """`phase:kind[,phase:kind...]` -> faults; a ValueError says what is wrong."""
    faults = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        phase, sep, kind = item.partition(":")
        if not sep or phase not in FAULT_PHASES:
            raise ValueError(f"{item!r}: expected phase:kind with phase one of "
                             f"{', '.join(FAULT_PHASES)}")
        if kind.startswith("delay="):
            seconds = float(kind.removeprefix("delay="))
            if not 0 <= seconds <= MAX_DELAY_S:
                raise ValueError(f"{item!r}: delay must be in [0, {MAX_DELAY_S:.0f}] s")
            faults.append(Fault(phase, "delay", seconds))
        elif kind in RAISING_KINDS:
            faults.append(Fault(phase, kind))
        else:
            raise ValueError(f"{item!r}: kind must be one of {', '.join(RAISING_KINDS)} "
                             "or delay=SECONDS")
    return tuple(faults)


class FaultInjector:
    """Fires faults from the worker thread; every method runs there, so no lock."""

    def __init__(self, faults: Sequence[Fault]) -> None:
        self._armed = list(faults)
        self._run_phases: tuple[str, ...] = ()
        self._finished: set[str] = set()
        self._entered: set[str] = set()
        self.fired: list[Fault] = []  # for tests and logs

    def start_run(self, phases: Sequence[str] = RUN_PHASES) -> None:
        self._run_phases = tuple(p for p in phases if p in RUN_PHASES)
        self._finished, self._entered = set(), set()

    def watching(self, progress: ProgressCallback) -> ProgressCallback:
        """Forward the run's progress, noting which phases have finished."""

        def observe(event: ProgressEvent) -> None:
            if event.steps_total > 0 and event.steps_done >= event.steps_total:
                self._finished.add(event.phase)
            progress(event)

        return observe

    def wrap_runner(self, runner: Any) -> None:
        """Route the runner's two callbacks (what every warmup step calls) through `enter`."""
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
            self._armed.remove(fault)
            raise fault.exception()

    def _guarded(self, call: Callable[..., Any]) -> Callable[..., Any]:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            # The phase running now: the first of the run's phases that has not finished.
            current = next((p for p in self._run_phases if p not in self._finished), None)
            # A step that schedules nothing only frees the last phase's requests (its
            # `finally`); failing it would strand them in the runner, which no real error
            # in a phase's own work does.
            if current is not None and not _frees_only(args):
                self.enter(current)
            return call(*args, **kwargs)

        return guarded


def _frees_only(args: tuple[Any, ...]) -> bool:
    scheduler_output = args[0] if args else None
    return getattr(scheduler_output, "total_num_scheduled_tokens", None) == 0 and \
        bool(getattr(scheduler_output, "finished_req_ids", None))
