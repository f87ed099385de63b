"""Progress lines while a long phase runs, for the programs that run the plan without a server
(`python -m warmgate.server.run_warmup`, `warmgate-server --warmup-only`).

A server's watchers follow WatchStatus; these programs print one line per phase as it ends,
so a phase of two minutes (the sampler's on a CPU with llama-3.2-1b) was two minutes of
silence. A phase that has run QUIET_S seconds gets a line, then one every INTERVAL_S, saying
which phase runs, its place in the plan, the steps done and the seconds spent. The plan's own
events say when a step ends, not when a phase begins, so the phase after the last one that
ended is taken as running (a phase that skips ends at once and says so itself).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType

from warmgate.server.core.phases import PLAN_PHASES, TP_PLAN_PHASES
from warmgate.server.core.progress import ProgressEvent

logger = logging.getLogger(__name__)

QUIET_S = 5.0  # a phase shorter than this prints nothing beyond its own result line
INTERVAL_S = 10.0  # after that, a line at least this often
TICK_S = 0.5  # how often the reporting thread looks


class ProgressLog:
    """A ProgressCallback and, as a context manager, the thread that prints the lines."""

    def __init__(self, names: Sequence[str], *, clock: Callable[[], float] = time.monotonic,
                 emit: Callable[[str], None] = logger.info) -> None:
        self._names = tuple(names)
        self._clock = clock
        self._emit = emit
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        now = clock()
        self._started = now
        self._phase: str | None = None
        self._since = now
        self._done = self._total = 0
        self._next_at = now

    def begin(self, phase: str) -> None:
        """`phase` runs from now (the load, before the plan's first event)."""
        with self._lock:
            self._enter(phase, self._clock())

    def __call__(self, event: ProgressEvent) -> None:
        now = self._clock()
        with self._lock:
            if event.phase != self._phase:
                self._enter(event.phase, now)
            self._done, self._total = event.steps_done, event.steps_total
            if event.steps_total > 0 and event.steps_done >= event.steps_total:
                self._enter(self._after(event.phase), now)

    def due(self) -> str | None:
        """The line to print now, if one is due (the reporting thread's check)."""
        now = self._clock()
        with self._lock:
            if self._phase is None or now < self._next_at:
                return None
            self._next_at = now + INTERVAL_S
            return self._line(now)

    def _enter(self, phase: str | None, now: float) -> None:
        self._phase, self._since = phase, now
        self._done = self._total = 0
        self._next_at = now + QUIET_S

    def _after(self, phase: str) -> str | None:
        if phase not in self._names:
            return None
        at = self._names.index(phase) + 1
        return self._names[at] if at < len(self._names) else None

    def _line(self, now: float) -> str:
        assert self._phase is not None
        place = (f" ({self._names.index(self._phase) + 1}/{len(self._names)})"
                 if self._phase in self._names else "")
        steps = (f"step {self._done}/{self._total} done" if self._total
                 else "no step done yet")
        return (f"warmup progress: phase {self._phase}{place} running for "
                f"{now - self._since:.0f} s, {steps}; {now - self._started:.0f} s in all")

    def _run(self) -> None:
        while not self._stop.wait(TICK_S):
            line = self.due()
            if line is not None:
                self._emit(line)

    def start(self) -> ProgressLog:
        self._thread = threading.Thread(target=self._run, name="warmup-progress", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> ProgressLog:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def plan_names(tensor_parallel_size: int) -> tuple[str, ...]:
    """The plan's phases, load first, as its progress events number them."""
    return TP_PLAN_PHASES if tensor_parallel_size > 1 else PLAN_PHASES
