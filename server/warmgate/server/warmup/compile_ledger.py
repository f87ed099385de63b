"""Charge JIT counts to the warmup phase that was running when they happened."""

from __future__ import annotations

from warmgate.server.core.results import PhaseResult
from warmgate.server.jit.counts import JitCounts
from warmgate.server.jit.monitor import JitMonitor


class PhaseLedger:
    """`charge(phase)` after each of a phase's steps bills everything since the last charge
    to it; `fill(result)` copies a phase's bill into its PhaseResult."""

    def __init__(self, monitor: JitMonitor | None) -> None:
        self._monitor = monitor
        self._last = monitor.snapshot() if monitor is not None else JitCounts()
        self._bills: dict[str, JitCounts] = {}

    def charge(self, phase: str) -> None:
        if self._monitor is None:
            return
        now = self._monitor.snapshot()
        delta, self._last = now.minus(self._last), now
        if delta.compiles or delta.cache_hits or delta.cache_misses:
            self._bills[phase] = self._bills.get(phase, JitCounts()).plus(delta)

    def fill(self, result: PhaseResult) -> None:
        bill = self._bills.get(result.name)
        if bill is None:
            return
        result.compiles = dict(bill.compiles)
        result.cache_hits = sum(bill.cache_hits.values())
        result.cache_misses = sum(bill.cache_misses.values())
