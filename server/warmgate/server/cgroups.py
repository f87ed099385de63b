"""Where this process's cgroup limits live: cpu_threads.py reads the CPU quota from them,
host_memory.py the memory limit."""

from __future__ import annotations

from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def cgroup_dirs(root: Path, proc_cgroup: Path) -> list[Path]:
    """This process's cgroup directories, innermost first, up to the mount's root: a limit
    set on any ancestor applies. In a container the namespace root is the mount's root."""
    dirs = []
    try:
        for line in proc_cgroup.read_text().splitlines():
            hierarchy, _, path = line.partition("::")
            if hierarchy == "0" and path:  # the cgroup v2 line
                current = root / path.lstrip("/")
                while current != root and root in current.parents:
                    dirs.append(current)
                    current = current.parent
    except OSError:
        pass
    return [*dirs, root]
