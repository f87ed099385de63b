"""How many intra-op threads torch gets in the server process.

On a CPU device torch's default is one thread per core, and the model then competes with the
event loop, gRPC and the serving worker for those same cores: each parallel op waits at its
barrier for a thread the kernel descheduled. On a 2-core machine a 2 ms tiny-model prefill
then took 12 ms at the median in one process with its client, and the time to first token
of a separate server had a p90 4.3-4.7x that with one core left free (bench/cpu_threads.py;
its many-stream throughput was 0.93-1.73x in favour of both cores, so --cpu-threads sets
the count where that matters more). On CUDA the model's work is on the GPU and torch's
default stays.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, as a container's cpuset sets)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def intra_op_threads(requested: int, device: str, usable: int) -> int | None:
    """`requested` when set (> 0); else every usable core but one on a CPU device; None
    (torch's default) on an accelerator."""
    if requested > 0:
        return requested
    if not device.startswith("cpu"):
        return None
    return max(1, usable - 1)


def apply_cpu_threads(requested: int, device: str) -> int | None:
    """Set torch's intra-op thread count for this process (before the model loads); returns
    what was set, None when torch's default was kept."""
    usable = usable_cpus()
    threads = intra_op_threads(requested, device, usable)
    if threads is None:
        return None
    import torch  # the server loads it next anyway; not at import time

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    logger.info("torch intra-op threads: %d (torch default %d; %d usable CPUs; --cpu-threads "
                "%s)", threads, before, usable, requested or "auto")
    return threads
