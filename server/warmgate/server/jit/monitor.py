"""JitMonitor: one per runner; counts every JIT event and knows whether health is SERVING.

Observers (Triton, dynamo, FlashInfer hooks) call `record` from whatever thread compiled;
the runner sets `current_batch` before each forward so an event names the batch that caused
it. Listeners (metrics, the strict-mode policy) get every event; they run on the compiling
thread, so they must be quick and must not block on the event loop.

Under tensor parallel each rank has its own monitor (`rank` stamps its events); a worker's
events reach rank 0's monitor through `relay` (warmgate.server.distributed.replies), which
counts them apart, per rank (`snapshot_by_rank`), and hands them to the same listeners, so
the metrics label them with their rank and --strict-jit judges them like rank 0's own.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Protocol

from warmgate.server.jit.counts import CountsBuilder, JitCounts
from warmgate.server.jit.events import BatchShape, JitEvent

logger = logging.getLogger(__name__)

Listener = Callable[[JitEvent], None]


class Observer(Protocol):
    name: str
    # True for an observer whose install imports the attention backend's library (FlashInfer):
    # the engine imports that library on a thread of its own beside the weights' load, so
    # such an observer is held by `install` and installed by `install_pending`, which the
    # runner calls once the weights are in and right before it builds the backend. Nothing
    # of that library runs before then, so nothing compiles unseen.
    after_weights: bool

    def install(self, monitor: JitMonitor) -> bool:
        """Hook into the compiler; False when there is nothing to observe here."""

    def uninstall(self) -> None: ...

    def rearm(self) -> None:
        """Re-register hooks something else may have cleared (torch._dynamo.reset())."""


class JitMonitor:
    def __init__(self, rank: int = 0) -> None:
        self.rank = rank
        self._lock = threading.Lock()
        self._counts = CountsBuilder()
        self._remote: dict[int, CountsBuilder] = {}  # other ranks' relayed events
        self._ready = False
        self._listeners: list[Listener] = []
        self._observers: list[Observer] = []
        self._pending: list[Observer] = []  # after_weights observers not installed yet
        # Written by the runner before every forward, read by observers on the same thread.
        self.current_batch: BatchShape | None = None

    # -- readiness ----------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._ready

    def mark_ready(self) -> None:
        """From now on every compile is one that serving traffic would have paid for."""
        for observer in self._observers:
            observer.rearm()
        self._ready = True

    def mark_not_ready(self) -> None:
        """A (re-)warmup started: its compiles are the plan's, not traffic's."""
        self._ready = False

    def follow(self, ready: bool) -> None:
        """A worker rank's monitor: take rank 0's readiness (sent with every call)."""
        if ready and not self._ready:
            self.mark_ready()
        elif not ready:
            self._ready = False

    # -- observers and listeners --------------------------------------------------------
    def install(self, observers: Iterable[Observer]) -> list[str]:
        """Install each observer that applies here, but hold those marked after_weights for
        `install_pending`; returns the names of those installed now."""
        now: list[Observer] = []
        for observer in observers:
            (self._pending if observer.after_weights else now).append(observer)
        names = self._install(now)
        later = [o.name for o in self._pending]
        logger.info("JIT observers installed: %s%s", ", ".join(names) or "none",
                    f"; after the weights' load: {', '.join(later)}" if later else "")
        return names

    def install_pending(self) -> list[str]:
        """Install the observers `install` held (none: a no-op); returns their names."""
        if not self._pending:
            return []
        pending, self._pending = self._pending, []
        names = self._install(pending)
        logger.info("JIT observers installed after the weights' load: %s",
                    ", ".join(names) or "none")
        return names

    def _install(self, observers: list[Observer]) -> list[str]:
        installed = [o for o in observers if o.install(self)]
        self._observers.extend(installed)
        return [o.name for o in installed]

    @property
    def observers(self) -> list[str]:
        return [o.name for o in self._observers]

    def close(self) -> None:
        """Uninstall every observer (tests build many runners in one process)."""
        self._pending.clear()
        while self._observers:
            self._observers.pop().uninstall()

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    # -- events -------------------------------------------------------------------------
    def record(self, kind: str, *, name: str, compiled: bool = True,
               seconds: float = 0.0) -> JitEvent:
        """Called by observers (any thread) for every compile or cache load they see."""
        with self._lock:
            event = JitEvent(kind=kind, compiled=compiled, after_ready=self._ready, name=name,
                             batch=self.current_batch, seconds=seconds, rank=self.rank)
            self._counts.add(event)
        logger.debug("jit event: %s (after_ready=%s)", event.describe(), event.after_ready)
        self._notify(event)
        return event

    def relay(self, event: JitEvent) -> None:
        """An event another rank recorded (after_ready as that rank judged it, from the
        readiness this monitor sent it): counted under its rank, then to every listener."""
        with self._lock:
            self._remote.setdefault(event.rank, CountsBuilder()).add(event)
        logger.debug("jit event from rank %d: %s", event.rank, event.describe())
        self._notify(event)

    def _notify(self, event: JitEvent) -> None:
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:  # a listener's bug must not break the compile that called us
                logger.exception("JIT listener %r failed on %s", listener, event.kind)

    def snapshot(self) -> JitCounts:
        """This rank's own counts (the warmup's phases bill these)."""
        with self._lock:
            return self._counts.freeze()

    def snapshot_by_rank(self) -> dict[int, JitCounts]:
        """This rank's counts and every relayed rank's, by rank."""
        with self._lock:
            counts = {r: c.freeze() for r, c in self._remote.items()}
            counts[self.rank] = self._counts.freeze()
        return dict(sorted(counts.items()))

    def __enter__(self) -> JitMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
