"""Readiness: whether this server takes traffic now, and who hears when that changes.

SERVING means a warmup plan succeeded and nothing has failed since. The answer has two
audiences beside the RPCs that read it: gRPC health (warmgate.server.api.health) and the
`warmgate_ready` gauge (warmgate.server.telemetry.ready_gauge). Both are listeners, so this
module knows neither gRPC nor Prometheus. A fatal device error ends readiness for good.
Every method runs on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

from warmgate.server.control.status import StatusTracker, WarmupState
from warmgate.server.core.failures import FatalDeviceError, describe_fatal
from warmgate.server.core.results import WarmupReport

logger = logging.getLogger(__name__)

Spawn = Callable[[Coroutine[Any, Any, None]], None]


class ReadinessListener(Protocol):
    """Told each time readiness changes, in the order listeners were given."""

    async def serving_changed(self, serving: bool) -> None:
        """SERVING (True) or NOT_SERVING (False); repeated values are passed on too."""

    async def device_lost(self) -> None:
        """NOT_SERVING for good: nothing may turn this listener back to SERVING."""


class WarmupMetrics(Protocol):
    """What the controller records beside readiness (warmgate.server.telemetry.metrics)."""

    def set_state(self, state: str) -> None: ...

    def observe_report(self, report: WarmupReport) -> None: ...


class Readiness:
    def __init__(self, tracker: StatusTracker, spawn: Spawn, *,
                 listeners: Sequence[ReadinessListener] = (),
                 metrics: WarmupMetrics | None = None) -> None:
        self._tracker = tracker
        self._spawn = spawn
        self._listeners = tuple(listeners)
        self._metrics = metrics
        self._serving = False
        # Run before SERVING is announced (see add_ready_hook).
        self._ready_hooks: list[Callable[[], None]] = []
        # Run when readiness is lost (stored results no longer describe the runner).
        self._lost_hooks: list[Callable[[], None]] = []
        self._fatal: BaseException | None = None
        self._fatal_event = asyncio.Event()

    @property
    def serving(self) -> bool:
        return self._serving

    @property
    def fatal_error(self) -> BaseException | None:
        """The unrecoverable device error that took the server down, if one did."""
        return self._fatal

    async def wait_fatal(self) -> BaseException:
        """Return once a fatal device error happened (main then exits non-zero)."""
        await self._fatal_event.wait()
        assert self._fatal is not None  # set before the event; an invariant, not input
        return self._fatal

    def add_ready_hook(self, fn: Callable[[], None]) -> None:
        """fn() each time a plan succeeds, before SERVING is announced: for set-up the first
        request would otherwise pay for (the serving loop's KV block pool). An exception is
        logged, and readiness goes on without it."""
        self._ready_hooks.append(fn)

    def add_lost_hook(self, fn: Callable[[], None]) -> None:
        """fn() each time lose() takes readiness away."""
        self._lost_hooks.append(fn)

    async def set_serving(self, serving: bool) -> None:
        if serving:
            for fn in self._ready_hooks:
                try:
                    fn()
                except Exception:
                    logger.exception("a ready listener failed; the first request pays for "
                                     "what it would have prepared")
        self._serving = serving
        for listener in self._listeners:
            await listener.serving_changed(serving)
        self.observe_state()

    def lose(self, reason: str) -> None:
        """FAILED for `reason`, and NOT_SERVING. Not fatal: a forced WarmupKernels warms
        again and, if it succeeds, turns health SERVING. The first reason stands."""
        if self._fatal is not None or self._tracker.state is WarmupState.FAILED:
            return
        self._tracker.fail(reason)
        for fn in self._lost_hooks:
            fn()
        self._spawn(self.set_serving(False))

    async def device_lost(self, exc: BaseException) -> bool:
        """A sticky device error: FAILED and NOT_SERVING for good. False if one came before
        (the first error is the one reported)."""
        if self._fatal is not None:
            return False
        phase = exc.phase if isinstance(exc, FatalDeviceError) else "rpc"
        cause = exc.cause if isinstance(exc, FatalDeviceError) else exc
        logger.critical("%s", describe_fatal(phase, cause))
        self._fatal = exc
        self._tracker.fail(describe_fatal(phase, cause))
        for listener in self._listeners:
            await listener.device_lost()
        self.observe_state()
        self._fatal_event.set()
        return True

    def observe_state(self) -> None:
        """The warmup state gauge follows the tracker."""
        if self._metrics is not None:
            self._metrics.set_state(self._tracker.state.value)
