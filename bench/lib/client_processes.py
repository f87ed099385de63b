"""load_gen.run_load spread over several client processes, for loads one Python client cannot
read: a streamed message costs a grpc.aio client about 50 us of CPU on the 2-core machine
(bench/results/cpu-frontend-cost.txt), so one client process reads some 20,000 messages a
second, under the 50,000 tokens a second a 1B model's 128 streams are to reach.

The specs are dealt round robin, each process taking its share of the concurrency (the
remainder to the first), so the streams in flight stay the one figure the caller gave. Each
process connects, then waits at a barrier for the others, so the load starts together, not as
each process finishes importing. Results come back in spec order; their times are
time.perf_counter's, one monotonic clock for every process of the machine (CLOCK_MONOTONIC
on Linux), so gaps and windows across processes compare as within one.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
from collections.abc import Sequence
from typing import Any

from load_gen import run_load

from warmgate.server.devtools.load_stats import RequestResult
from warmgate.server.devtools.workload import RequestSpec

# Seconds a process may take to start, import and connect before the load gives up on it.
START_TIMEOUT_S = 120.0


def shares(concurrency: int | None, processes: int) -> list[int | None]:
    """Each process's cap on streams in flight: `concurrency` split, the remainder first."""
    if concurrency is None:
        return [None] * processes
    if concurrency < processes:
        raise ValueError(f"{processes} client processes need at least as many streams in "
                         f"flight, not {concurrency}")
    return [concurrency // processes + (i < concurrency % processes) for i in range(processes)]


def _worker(target: str, specs: Sequence[RequestSpec], concurrency: int | None,
            kwargs: dict[str, Any], barrier: Any, out: Any) -> None:
    out.put(asyncio.run(run_load(target, specs, concurrency=concurrency,
                                 connected=lambda: barrier.wait(START_TIMEOUT_S), **kwargs)))


def _collect(out: Any, workers: list[Any]) -> list[list[RequestResult]]:
    """Every worker's results, as they finish; a worker that exits without them (an
    exception, its traceback on stderr) ends the load."""
    parts: list[list[RequestResult]] = []
    while len(parts) < len(workers):
        try:
            parts.append(out.get(timeout=1.0))
        except queue.Empty:
            failed = [w.exitcode for w in workers if w.exitcode not in (None, 0)]
            if failed:
                raise RuntimeError(f"a client process exited with {failed[0]}") from None
    return parts


def run_load_processes(target: str, specs: Sequence[RequestSpec], *, processes: int,
                       concurrency: int | None = None, **kwargs: Any) -> list[RequestResult]:
    """run_load's results for `specs`, from `processes` client processes (1: this one)."""
    if processes < 1:
        raise ValueError(f"client processes must be at least 1, not {processes}")
    if processes == 1:
        return asyncio.run(run_load(target, specs, concurrency=concurrency, **kwargs))
    # Spawned, not forked: this process holds grpc's threads, which a fork does not carry.
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(processes), ctx.Queue()
    workers = [ctx.Process(target=_worker, args=(target, specs[i::processes], limit, kwargs,
                                                 barrier, out), daemon=True)
               for i, limit in enumerate(shares(concurrency, processes))]
    for w in workers:
        w.start()
    try:
        parts = _collect(out, workers)
    finally:
        for w in workers:
            w.join(10)
            if w.is_alive():
                w.kill()
    by_index = {r.index: r for part in parts for r in part}
    return [by_index[spec.index] for spec in specs]
