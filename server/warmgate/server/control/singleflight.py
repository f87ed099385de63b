"""Single flight with stored results, keyed: one run per key at a time, shared by all callers.

A caller arriving while a run for its key is in flight joins it; a caller arriving after a
kept success gets the stored result unless it forces a new run. The run is its own task and
callers await it through `asyncio.shield`, so a caller that cancels (deadline, disconnect)
never cancels the run the others are waiting for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


@dataclass(frozen=True)
class Shared(Generic[T]):
    value: T
    # This caller joined a run another caller started.
    joined_in_flight: bool = False
    # This caller got the kept result of an earlier run; nothing ran.
    from_stored: bool = False


class SingleFlight(Generic[K, T]):
    def __init__(self, keep: Callable[[T], bool]) -> None:
        self._keep = keep  # which results a later caller may be handed instead of a new run
        self._flights: dict[K, asyncio.Task[T]] = {}
        self._stored: dict[K, T] = {}

    def stored(self, key: K) -> T | None:
        return self._stored.get(key)

    def forget(self) -> None:
        """Drop every kept result (after a failure makes them stale)."""
        self._stored.clear()

    async def run(self, key: K, start: Callable[[], Awaitable[T]], *, force: bool = False
                  ) -> Shared[T]:
        task = self._flights.get(key)
        if task is not None:
            return Shared(await asyncio.shield(task), joined_in_flight=True)
        if not force and key in self._stored:
            return Shared(self._stored[key], from_stored=True)
        task = asyncio.ensure_future(start())
        self._flights[key] = task
        task.add_done_callback(lambda t: self._finish(key, t))
        return Shared(await asyncio.shield(task))

    def _finish(self, key: K, task: asyncio.Task[T]) -> None:
        del self._flights[key]
        if task.cancelled() or task.exception() is not None:
            return
        result = task.result()
        if self._keep(result):
            self._stored[key] = result
        else:
            self._stored.pop(key, None)
