"""The host memory a new allocation can take, asked before the KV cache is allocated on the
CPU. There, torch.zeros of more than the host holds does not fail: Linux overcommits virtual
memory, so the allocation succeeds and the zero fill then touches page after page until the
kernel's OOM killer ends the process without a word. CUDA needs no such check: its allocator
refuses an allocation it cannot back at once, with an error the caller reports."""

from __future__ import annotations

from pathlib import Path

from warmgate.server.cgroups import CGROUP_ROOT, PROC_CGROUP, cgroup_dirs

MEMINFO = Path("/proc/meminfo")
# cgroup v1 writes "no limit" as the largest page-aligned 64-bit number (about 2**63).
V1_NO_LIMIT = 1 << 62


def meminfo_available(meminfo: Path = MEMINFO) -> int | None:
    """MemAvailable in bytes: free memory plus what the kernel can reclaim (page cache)
    without swapping; None where the file cannot be read."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _stat_value(stat: Path, key: str) -> int:
    try:
        for line in stat.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def cgroup_headroom(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> int | None:
    """Bytes left under the tightest memory limit of this process's cgroups (v2 memory.max
    on each level, v1 memory.limit_in_bytes), with the inactive page cache counted as free:
    the kernel reclaims it before the limit bites, and the weights just read sit there. None
    where no limit is set."""
    headrooms = []
    for d in cgroup_dirs(root, proc_cgroup):
        try:
            limit = (d / "memory.max").read_text().strip()
            if limit != "max":
                used = int((d / "memory.current").read_text())
                headrooms.append(int(limit) - used + _stat_value(d / "memory.stat",
                                                                  "inactive_file"))
        except (OSError, ValueError):
            continue
    v1 = root / "memory"
    try:
        limit_v1 = int((v1 / "memory.limit_in_bytes").read_text())
        if limit_v1 < V1_NO_LIMIT:
            used = int((v1 / "memory.usage_in_bytes").read_text())
            headrooms.append(limit_v1 - used + _stat_value(v1 / "memory.stat",
                                                            "total_inactive_file"))
    except (OSError, ValueError):
        pass
    return max(0, min(headrooms)) if headrooms else None


def host_available_bytes(meminfo: Path = MEMINFO, root: Path = CGROUP_ROOT,
                         proc_cgroup: Path = PROC_CGROUP) -> int | None:
    """What a new allocation on the host can take: the smaller of MemAvailable and the
    cgroup's headroom; None where neither can be read."""
    known = [v for v in (meminfo_available(meminfo), cgroup_headroom(root, proc_cgroup))
             if v is not None]
    return min(known) if known else None
