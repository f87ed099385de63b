"""The device's primary CUDA context, made through the driver API before torch touches CUDA.

torch's lazy CUDA initialisation runs with the GIL held, so while the start-up's background
thread created the context that way, main's imports and configuration checks could not run
beside it, though that overlap is the thread's reason to exist. ctypes releases the GIL for
the length of every foreign call; so the background thread first makes the primary context
here (cuInit, cuDeviceGet, cuDevicePrimaryCtxRetain), and torch's own initialisation after
it finds the driver initialised and the primary context made: the one context the CUDA
runtime, and so torch, uses on that device. The reference this retains is never released:
the context lives as long as the process, as it would under torch alone.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

DRIVER_LIBRARY = "libcuda.so.1"


def device_ordinal(device: str) -> int:
    """The CUDA ordinal a --device value names ("cuda" and "auto" mean torch's default, 0)."""
    _, _, index = device.partition(":")
    return int(index) if index.isdigit() else 0


def retain_primary_context(ordinal: int,
                           load: Callable[[str], ctypes.CDLL] = ctypes.CDLL) -> str | None:
    """Create (or retain) the primary context of device `ordinal`; None when it exists now,
    else why not (no driver library, or the call that failed and its CUresult). A failure
    changes nothing: torch's initialisation then does all the work, and reports it."""
    try:
        driver = load(DRIVER_LIBRARY)
    except OSError as exc:
        return f"no CUDA driver library ({exc})"
    device, context = ctypes.c_int(), ctypes.c_void_p()
    calls: list[tuple[str, Callable[[], int]]] = [
        ("cuInit", lambda: driver.cuInit(0)),
        ("cuDeviceGet", lambda: driver.cuDeviceGet(ctypes.byref(device), ordinal)),
        ("cuDevicePrimaryCtxRetain",
         lambda: driver.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)),
    ]
    for name, call in calls:
        result = call()
        if result != 0:
            return f"{name} returned CUresult {result}"
    return None
