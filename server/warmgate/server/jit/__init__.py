"""JIT observers: count every compile, before and after ready, with the batch that caused it.

Importing this package imports neither torch, triton nor flashinfer; each observer imports
its compiler only when installed (see `install.observers_for`).
"""

from warmgate.server.jit.counts import JitCounts
from warmgate.server.jit.events import COMPILE_KINDS, KINDS, BatchShape, JitEvent
from warmgate.server.jit.monitor import JitMonitor, Observer
from warmgate.server.jit.strict import STRICT_MODES, StrictJitPolicy

__all__ = [
    "COMPILE_KINDS",
    "KINDS",
    "STRICT_MODES",
    "BatchShape",
    "JitCounts",
    "JitEvent",
    "JitMonitor",
    "Observer",
    "StrictJitPolicy",
]
