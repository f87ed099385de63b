"""The garbage collector after a warmup: collect once, then freeze what is left.

The model load and the warmup build long-lived objects by the hundred thousand (the model's
modules, compiled kernels, CUDA graphs, their launchers) that sit in the collector's young
generations when the warmup ends. The next collection of the oldest generation walks every
one of them and finds next to nothing, holding the GIL for tens of milliseconds: left alone,
it fires during the first requests after ready. So each process that serves (the server, the
engine process, a tensor-parallel worker rank) collects once after a successful warmup,
before readiness turns SERVING, and moves what survived into the permanent generation
(gc.freeze: never walked again, freed as usual once unreferenced).

Frozen reference cycles are never collected, and a forced re-warmup or a mixed warmup drops
the graphs it rebuilds: so before a warmup the last warmup's freeze is handed back
(gc.unfreeze), and the warmup's success freezes again. gc has one permanent generation: that
also hands back what main froze after the imports (control/import_collection.py), which the
next freeze takes again. The first warmup keeps the imports' freeze: nothing was frozen here.
"""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass

logger = logging.getLogger(__name__)

# The programs a tensor-parallel worker rank runs on rank 0's word (tp_worker.py registers
# them; TensorParallelRunner.tell_workers sends them).
FREEZE_PROGRAM = "freeze_heap"
THAW_PROGRAM = "thaw_heap"

# gc's permanent generation is the process's: so is the record of who filled it.
_frozen_by_warmup = False


@dataclass(frozen=True)
class HeapFreeze:
    collected: int  # unreachable objects the collection found
    frozen: int  # objects this freeze moved into the permanent generation
    ms: float  # the collection and the freeze


def freeze_warm_heap(process: str, runner: object | None = None) -> HeapFreeze:
    """A warmup succeeded: collect everything, then freeze what survived; one log line.

    `process` names this process in the line ("server", "engine", "rank 1"). `runner`: the
    runner this process drives; a tensor-parallel rank 0's tells its workers to do the same
    (they run it before their next step)."""
    global _frozen_by_warmup
    _tell_workers(runner, FREEZE_PROGRAM)
    start = time.perf_counter()
    collected = gc.collect()
    # What the freeze moves: every object the collector still tracks. (Not from
    # gc.get_freeze_count, which walks the whole permanent generation, the imports' objects
    # included: tens of milliseconds per call.)
    frozen = len(gc.get_objects())
    gc.freeze()
    result = HeapFreeze(collected, frozen, (time.perf_counter() - start) * 1e3)
    _frozen_by_warmup = True
    logger.info("%s: heap frozen after warmup: %d objects collected, %d frozen in %.1f ms",
                process, result.collected, result.frozen, result.ms)
    return result


def thaw_warm_heap(runner: object | None = None) -> bool:
    """A warmup starts (or the server stops): hand what the last warmup froze back to the
    collector, so the graphs it replaces can be collected. False if nothing was frozen by a
    warmup (the imports' freeze then stays)."""
    global _frozen_by_warmup
    if not _frozen_by_warmup:
        return False
    _tell_workers(runner, THAW_PROGRAM)
    gc.unfreeze()
    _frozen_by_warmup = False
    return True


def _tell_workers(runner: object | None, program: str) -> None:
    # Only a tensor-parallel rank 0's runner has workers to tell (distributed/runners.py);
    # read by name so this module imports no runner (torch) code.
    tell = getattr(runner, "tell_workers", None)
    if tell is None:
        return
    try:
        tell(program)
    except Exception as exc:  # a lost worker: its watchdog takes the server down, not this
        logger.warning("tensor parallel: the workers were not told to %s: %s", program, exc)
