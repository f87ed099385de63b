"""Which configuration of the smoke starts next, and the same decisions replayed on given
durations to predict a run (bench/warm.py smoke --plan).

A configuration waits for its gate and for memory. The gate: a FlashInfer configuration waits
for its JIT key's prebuild (bench/lib/smoke_jit.py); another backend's configurations wait
while that backend's first run goes alone, so its cold compile (about 15 s) is paid once.
Memory: the queue runs the largest first. When the head (the first configuration whose gate
is open) does not fit, it keeps its place: a smaller one starts beside the runs only if it
also fits beside the head and the others started while the head waited. Once the runs that
were there when the head began to wait have ended, the head fits, so the large presets
(qwen3-30b-a3b in bf16 takes most of an H100) are not passed until the deadline.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from smoke_jit import PREBUILD_BYTES, JitKey
from smoke_plan import SmokeConfig, memory_bytes


def alone_backends(keys: Mapping[SmokeConfig, JitKey | None]) -> set[str]:
    """The backends without a prebuild: each warms its first run alone."""
    return {c.backend for c, key in keys.items() if key is None}


class Gates:
    """What a configuration waits for besides memory."""

    def __init__(self, keys: Mapping[SmokeConfig, JitKey | None]) -> None:
        self.keys = keys
        # Backends without a prebuild whose first run has not ended yet.
        self.alone = alone_backends(keys)
        self.built: set[JitKey] = set()

    def may_start(self, config: SmokeConfig, running: Sequence[SmokeConfig]) -> bool:
        key = self.keys.get(config)
        if key is not None:
            return key in self.built
        return config.backend not in self.alone or not any(
            r.backend == config.backend for r in running)

    def compiled(self, backend: str) -> None:
        """A run of this backend is ready (or ended): its cold compile is in the caches."""
        self.alone.discard(backend)


@dataclass
class Scheduler:
    """The start decision (see the module's docstring). `budget`: the bytes the running
    servers' and prebuilds' estimates may add up to; `parallel`: servers at once, at most."""

    budget: int
    parallel: int
    head: SmokeConfig | None = None  # the configuration that waits for memory
    beside: set[SmokeConfig] = field(default_factory=set)  # started while the head waited

    def pick(self, queue: Sequence[SmokeConfig], running: Sequence[SmokeConfig],
             may_start: Callable[[SmokeConfig], bool], held: int = 0) -> SmokeConfig | None:
        """The configuration to start now, or None; `held`: bytes the prebuilds hold."""
        self.beside &= set(running)
        if len(running) >= self.parallel:
            return None
        free = self.budget - held - sum(memory_bytes(c) for c in running)
        eligible = [c for c in queue if may_start(c)]
        if not eligible:
            return None
        head = eligible[0]
        if memory_bytes(head) <= free or not (running or held):
            self.head, self.beside = None, set()
            return head
        if head != self.head:  # a new head: it waits for every run there now
            self.head, self.beside = head, set()
        if len(self.beside) + 2 > self.parallel:  # the head needs a slot of its own
            return None
        reserved = memory_bytes(head) + sum(memory_bytes(c) for c in self.beside)
        for config in eligible[1:]:
            size = memory_bytes(config)
            if size <= free and reserved + size <= self.budget:
                self.beside.add(config)
                return config
        return None


@dataclass(frozen=True)
class Planned:
    config: SmokeConfig
    start_s: float
    end_s: float
    ready_s: float  # when its warmup ended: its backend's cold compile is in the caches


def simulate(queue: Sequence[SmokeConfig], keys: Mapping[SmokeConfig, JitKey | None],
             seconds: Mapping[SmokeConfig, tuple[float, float]],
             build_s: Mapping[JitKey, float], budget: int, parallel: int, deadline_s: float
             ) -> tuple[list[Planned], list[SmokeConfig]]:
    """The smoke's start decisions on known (run, ready) seconds per configuration and
    prebuild seconds per key, without TTFT stops: the runs in the order they end, and the
    configurations the deadline left."""
    left, gates, scheduler = list(queue), Gates(keys), Scheduler(budget, parallel)
    building = {key: build_s[key] for key in {k for k in keys.values() if k is not None}}
    running: list[Planned] = []
    done: list[Planned] = []
    now = 0.0
    while left or running:
        for run in running:
            if run.ready_s <= now:
                gates.compiled(run.config.backend)
        configs = [p.config for p in running]  # grows as runs start: the gates see them
        may_start = functools.partial(gates.may_start, running=configs)
        while left and now < deadline_s:
            config = scheduler.pick(left, configs, may_start,
                                    held=PREBUILD_BYTES * len(building))
            if config is None:
                break
            left.remove(config)
            configs.append(config)
            run_s, ready_s = seconds[config]
            running.append(Planned(config, now, now + run_s, now + min(ready_s, run_s)))
        ends = [p.end_s for p in running] + list(building.values()) + [
            p.ready_s for p in running if p.ready_s > now and p.config.backend in gates.alone]
        if not ends:  # nothing runs and nothing may start: the deadline has passed
            break
        now = min(ends)
        for key in [k for k, end in building.items() if end <= now]:
            del building[key]
            gates.built.add(key)
        for run in sorted((p for p in running if p.end_s <= now), key=lambda p: p.start_s):
            running.remove(run)
            done.append(run)
    return done, left


def read_seconds(text: str) -> dict[str, tuple[float, float]]:
    """(run, ready) seconds per configuration name, from a table whose `#` header line names
    the columns `configuration`, `ran_s` and `ready_s` (the smoke's measured rows, e.g.
    `configuration estimate_GiB ran_s stopped_s ready_s`); other `#` lines skipped."""
    columns: list[str] | None = None
    out = {}
    for line in text.splitlines():
        fields = line.split()
        if fields[:2] == ["#", "configuration"]:
            columns = fields[1:]
        if not fields or fields[0].startswith("#"):
            continue
        if columns is None or not {"ran_s", "ready_s"} <= set(columns):
            raise ValueError("no '# configuration ... ran_s ... ready_s' header line before "
                             f"{line!r}")
        try:
            out[fields[0]] = (float(fields[columns.index("ran_s")]),
                              float(fields[columns.index("ready_s")]))
        except (IndexError, ValueError):
            raise ValueError(f"{line!r}: no ran_s and ready_s figures") from None
    return out


def format_plan(done: Sequence[Planned], left: Sequence[SmokeConfig], deadline_s: float
                ) -> list[str]:
    """The predicted run: one line per configuration by start, then the makespan."""
    lines = [f"{p.start_s:6.0f} s .. {p.end_s:4.0f} s  {p.config.name:34} "
             f"{memory_bytes(p.config) / 2**30:5.1f} GiB"
             for p in sorted(done, key=lambda p: (p.start_s, p.config.name))]
    lines += [f"{'':15} {c.name:34} not run: past --deadline-s {deadline_s:.0f}" for c in left]
    end = max((p.end_s for p in done), default=0.0)
    lines.append(f"predicted: {len(done)} runs in {end:.0f} s, {len(left)} left by the deadline")
    return lines
