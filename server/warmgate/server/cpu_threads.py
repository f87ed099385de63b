"""How many intra-op threads torch gets in the server process.

On a CPU device torch's default is one thread per core, and the model then competes with the
event loop, gRPC and the serving worker for those same cores: each parallel op waits at its
barrier for a thread the kernel descheduled, so leaving one core free shortens prefill and
the time to first token on a small machine, while many-stream throughput favours every core
(bench/results/cpu-threads.txt, from bench/serve.py cpu-threads); --cpu-threads sets the count where
throughput matters more. On CUDA the model's work is on the GPU and torch's default stays.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

from warmgate.server.cgroups import CGROUP_ROOT, PROC_CGROUP, cgroup_dirs

logger = logging.getLogger(__name__)


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> int | None:
    """CPUs the cgroup's quota allows (cgroup v2 cpu.max, v1 cpu.cfs_quota_us), rounded
    up; None when no quota is set or the files cannot be read."""
    limits = []
    for d in cgroup_dirs(root, proc_cgroup):
        try:
            fields = (d / "cpu.max").read_text().split()  # "max 100000" or "200000 100000"
            if len(fields) == 2 and fields[0] != "max":
                limits.append(int(fields[0]) / int(fields[1]))
        except (OSError, ValueError):
            continue
    v1 = root / "cpu"
    try:
        quota_us = int((v1 / "cpu.cfs_quota_us").read_text())
        if quota_us > 0:
            limits.append(quota_us / int((v1 / "cpu.cfs_period_us").read_text()))
    except (OSError, ValueError):
        pass
    return max(1, math.ceil(min(limits))) if limits else None


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (a container's cpuset), capped by
    its cgroup's CPU quota (a pod's CPU limit, which Kubernetes sets as cpu.max: a 2-CPU limit
    on a 64-core node leaves 64 cores in the mask but 2 CPUs of time)."""
    affinity = getattr(os, "sched_getaffinity", None)
    cpus = len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)
    quota = cgroup_cpu_limit()
    return cpus if quota is None else min(cpus, quota)


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
    logger.info("torch intra-op threads: %d (torch default %d; %d usable CPUs, cgroup CPU quota "
                "%s; --cpu-threads %s)", threads, before, usable,
                cgroup_cpu_limit() or "none", requested or "auto")
    return threads
