"""Counters of JIT events, by kind and by cache, with the arithmetic phases need (deltas)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from warmgate.server.jit.events import CACHED_KINDS, COMMUNICATOR_SETUP, JitEvent


@dataclass(frozen=True)
class JitCounts:
    # kind -> compiles (cache misses), whenever they happened.
    compiles: dict[str, int] = field(default_factory=dict)
    # kind -> compiles after ready (the ones strict mode is about).
    after_ready: dict[str, int] = field(default_factory=dict)
    # cache (triton, flashinfer, inductor) -> loads from a compile cache / builds that missed it.
    cache_hits: dict[str, int] = field(default_factory=dict)
    cache_misses: dict[str, int] = field(default_factory=dict)
    # CUDA-graph misses are counted apart: they compile nothing.
    graph_misses: int = 0
    graph_misses_after_ready: int = 0
    # Tensor parallel: first uses of a collective (communicator set-ups), likewise apart.
    communicator_setups: int = 0
    communicator_setups_after_ready: int = 0

    @property
    def total_after_ready(self) -> int:
        return sum(self.after_ready.values())

    def plus(self, other: JitCounts) -> JitCounts:
        return JitCounts(
            compiles=_add(self.compiles, other.compiles),
            after_ready=_add(self.after_ready, other.after_ready),
            cache_hits=_add(self.cache_hits, other.cache_hits),
            cache_misses=_add(self.cache_misses, other.cache_misses),
            graph_misses=self.graph_misses + other.graph_misses,
            graph_misses_after_ready=(self.graph_misses_after_ready
                                      + other.graph_misses_after_ready),
            communicator_setups=self.communicator_setups + other.communicator_setups,
            communicator_setups_after_ready=(self.communicator_setups_after_ready
                                             + other.communicator_setups_after_ready))

    def minus(self, earlier: JitCounts) -> JitCounts:
        """What happened since `earlier` (a snapshot of the same monitor)."""
        return JitCounts(
            compiles=_sub(self.compiles, earlier.compiles),
            after_ready=_sub(self.after_ready, earlier.after_ready),
            cache_hits=_sub(self.cache_hits, earlier.cache_hits),
            cache_misses=_sub(self.cache_misses, earlier.cache_misses),
            graph_misses=self.graph_misses - earlier.graph_misses,
            graph_misses_after_ready=(self.graph_misses_after_ready
                                      - earlier.graph_misses_after_ready),
            communicator_setups=self.communicator_setups - earlier.communicator_setups,
            communicator_setups_after_ready=(self.communicator_setups_after_ready
                                             - earlier.communicator_setups_after_ready))


def _add(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: a.get(k, 0) + b.get(k, 0) for k in {*a, *b}}


def _sub(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    out = {k: v - b.get(k, 0) for k, v in a.items()}
    return {k: v for k, v in out.items() if v}


class CountsBuilder:
    """The mutable side, held under the monitor's lock."""

    def __init__(self) -> None:
        self.compiles: Counter[str] = Counter()
        self.after_ready: Counter[str] = Counter()
        self.cache_hits: Counter[str] = Counter()
        self.cache_misses: Counter[str] = Counter()
        self.graph_misses = 0
        self.graph_misses_after_ready = 0
        self.communicator_setups = 0
        self.communicator_setups_after_ready = 0

    def add(self, event: JitEvent) -> None:
        if event.kind == COMMUNICATOR_SETUP:
            self.communicator_setups += 1
            self.communicator_setups_after_ready += event.after_ready
            return
        if not event.is_compile and event.compiled:  # a CUDA-graph miss
            self.graph_misses += 1
            self.graph_misses_after_ready += event.after_ready
            return
        cached = event.kind in CACHED_KINDS  # dynamo keeps no compile cache across processes
        if event.compiled:
            self.compiles[event.kind] += 1
            if event.after_ready:
                self.after_ready[event.kind] += 1
            if cached:
                self.cache_misses[event.kind] += 1
        elif cached:
            self.cache_hits[event.kind] += 1

    def freeze(self) -> JitCounts:
        return JitCounts(compiles=dict(self.compiles), after_ready=dict(self.after_ready),
                         cache_hits=dict(self.cache_hits), cache_misses=dict(self.cache_misses),
                         graph_misses=self.graph_misses,
                         graph_misses_after_ready=self.graph_misses_after_ready,
                         communicator_setups=self.communicator_setups,
                         communicator_setups_after_ready=self.communicator_setups_after_ready)
