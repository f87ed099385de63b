"""Run named callables at once on threads (or one after the other) and time each.

FlashInfer's JIT spends its time in nvcc/ninja subprocesses, which release the GIL, so
threads overlap the builds of two modules. Pure Python: tested on the CPU.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Timings:
    # name -> seconds that callable took on its own thread
    seconds: dict[str, float] = field(default_factory=dict)
    # Wall time of the whole batch: max(seconds) when they overlap, sum when sequential.
    wall_s: float = 0.0
    results: dict[str, Any] = field(default_factory=dict)
    parallel: bool = True

    @property
    def longest_s(self) -> float:
        return max(self.seconds.values(), default=0.0)


def run_concurrently(named: Mapping[str, Callable[[], Any]], *, parallel: bool = True
                     ) -> Timings:
    """Call every callable (on its own thread when `parallel`), wait for all, time each.

    If any raised, the first one's exception (in `named` order) is re-raised after all have
    finished, so no thread is left running behind the caller's back.
    """
    out = Timings(parallel=parallel)
    errors: dict[str, BaseException] = {}

    def call(name: str, fn: Callable[[], Any]) -> None:
        start = time.perf_counter()
        try:
            out.results[name] = fn()
        except BaseException as exc:  # re-raised on the caller's thread below
            errors[name] = exc
        finally:
            out.seconds[name] = time.perf_counter() - start

    start = time.perf_counter()
    if parallel and len(named) > 1:
        threads = [threading.Thread(target=call, args=(n, fn), name=f"warmgate-{n}", daemon=True)
                   for n, fn in named.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for n, fn in named.items():
            call(n, fn)
    out.wall_s = time.perf_counter() - start
    for name in named:
        if name in errors:
            raise errors[name]
    return out
