"""The GPU's SM clock now, read without a CUDA context in the reading process.

A first request after a server sat idle may run while the GPU's clocks are still low: the
driver lowers them when nothing runs and raises them again once work comes. A TTFT of a few
milliseconds (the tiny model's) moves with that by more than the smoke's 15 %, so the smoke
prints the clock read before each timed request's idle gap beside its TTFT: the first one's
after the server sat idle since ready, the steady ones' just after the request before. NVML
(pynvml) where the image has it, else one `nvidia-smi` query; None on a machine with neither
(a CPU run).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable


def sm_clock_reader(index: int = 0) -> Callable[[], int | None]:
    """A function returning GPU `index`'s current SM clock in MHz, or None."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return lambda: int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
    except Exception:  # no pynvml, no driver: the query tool, if any
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return lambda: None

    def query() -> int | None:
        try:
            out = subprocess.run([smi, "-i", str(index), "--query-gpu=clocks.sm",
                                  "--format=csv,noheader,nounits"], capture_output=True,
                                 text=True, timeout=5, check=True).stdout
            return int(out.split()[0])
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            return None

    return query
