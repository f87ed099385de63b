"""The garbage collector during the start-up's imports.

Importing torch, gRPC and the server builds a few hundred thousand long-lived objects
(modules, functions, torch's operator registry). Every collection of the oldest generation
walks all of them and finds next to nothing, holding the GIL that the CUDA context's thread
and the rest of the start-up wait on; and the CUDA graph capture's collection walks them again.
So main turns the collector off for the imports and the configuration checks, then moves
everything they built into the permanent generation (gc.freeze: never walked again, freed as
usual once unreferenced) and turns it back on for the model load, the warmup and serving, whose
garbage it then collects as usual. bench/start.py profile counts the collections.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def collector_off_for_imports() -> Iterator[Callable[[], None]]:
    """The collector off until the callback it yields is called (the imports are done): that
    freezes what exists and turns it back on. On the way out the frozen objects are handed
    back to the collector (a caller of main in this process, a test, keeps collecting them);
    a block left before the callback just turns it back on."""
    was_enabled = gc.isenabled()
    frozen = False

    def imports_done() -> None:
        nonlocal frozen
        if frozen:
            return
        frozen = True
        gc.freeze()
        if was_enabled:
            gc.enable()

    gc.disable()
    try:
        yield imports_done
    finally:
        if frozen:
            gc.unfreeze()
        elif was_enabled:
            gc.enable()
