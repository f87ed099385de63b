"""Does creating the CUDA context on a background thread stall the main thread's Python?

Each variant runs in a fresh process: `none` (a pure-Python workload alone), `torch` (the
workload beside a thread running torch.zeros on cuda, as control/background_startup.py does)
and `driver` (the same thread making the primary context through the driver API with ctypes,
which releases the GIL, before torch.zeros). Prints one JSON line per process: the workload's
wall time, the sum of its pauses longer than 2 ms (a GIL the other thread held), and the
thread's seconds.

    python bench/start.py cuda-init-gil            # 3 rounds of the three variants (needs CUDA)
    python bench/start.py cuda-init-gil none       # one process, one variant
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import threading
import time

VARIANTS = ("none", "torch", "driver")
STALL_S = 0.002  # a pause longer than this between checks is another thread holding the GIL


def workload(n: int = 4_000_000) -> tuple[float, float]:
    """Pure Python work; (its wall seconds, the sum of its pauses longer than STALL_S)."""
    t = time.perf_counter()
    gaps = 0.0
    last = t
    acc = 0
    for i in range(n):
        acc += len(str(i)) * 3 % 7
        if i % 200 == 0:
            now = time.perf_counter()
            gap = now - last
            last = now
            if gap > STALL_S:
                gaps += gap
    return time.perf_counter() - t, gaps


def driver_init(ordinal: int = 0) -> None:
    """The device's primary context through the driver API (ctypes releases the GIL)."""
    lib = ctypes.CDLL("libcuda.so.1")
    assert lib.cuInit(0) == 0
    dev = ctypes.c_int()
    assert lib.cuDeviceGet(ctypes.byref(dev), ordinal) == 0
    ctx = ctypes.c_void_p()
    assert lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0


def child(variant: str) -> None:
    import torch

    out: dict[str, object] = {}

    def cuda() -> None:
        t = time.perf_counter()
        if variant == "driver":
            driver_init()
            out["driver_s"] = time.perf_counter() - t
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
        out["cuda_s"] = time.perf_counter() - t

    th = None
    if variant != "none":
        th = threading.Thread(target=cuda)
        th.start()
    w, gaps = workload()
    join_wait = 0.0  # with no CUDA thread there is nothing to wait for
    if th:
        t = time.perf_counter()
        th.join()
        join_wait = time.perf_counter() - t
    out.update(variant=variant, workload_s=round(w, 4), stalls_s=round(gaps, 4),
               join_wait_s=round(join_wait, 4))
    print(json.dumps(out))


if __name__ == "__main__":
    usage = f"usage: {sys.argv[0]} [{'|'.join(VARIANTS)}]"
    if sys.argv[1:] in (["-h"], ["--help"]):
        print(f"{usage}\n\n{__doc__}")
        sys.exit()
    if len(sys.argv) > 1:
        if sys.argv[1] not in VARIANTS:
            sys.exit(usage)
        child(sys.argv[1])
        sys.exit()
    for _ in range(3):
        for v in VARIANTS:
            print(subprocess.run([sys.executable, __file__, v], capture_output=True,
                                 text=True).stdout.strip(), flush=True)
