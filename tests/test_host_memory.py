"""The host memory a CPU KV cache may take, and the check before it is allocated: past what
the host holds, torch.zeros does not fail (Linux overcommits) but fills pages until the OOM
killer ends the process, so the cache is refused first, naming the settings to lower."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from warmgate.server.host_memory import cgroup_headroom, host_available_bytes, meminfo_available
from warmgate.server.runner import kv_cache
from warmgate.server.runner.kv_cache import (
    FullAttentionSpec,
    KVCacheAllocationError,
    allocate_kv_cache,
)

GIB = 1 << 30
MEMINFO = "MemTotal:       25000000 kB\nMemFree:         1000000 kB\nMemAvailable:    8000000 kB\n"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _v2_pod(tmp_path: Path, limit: str, current: int, inactive_file: int) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    pod = root / "kubepods" / "pod1"
    _write(pod / "memory.max", limit + "\n")
    _write(pod / "memory.current", f"{current}\n")
    _write(pod / "memory.stat", f"anon 100\nfile 5\ninactive_file {inactive_file}\n")
    _write(tmp_path / "self_cgroup", "0::/kubepods/pod1\n")
    return root, tmp_path / "self_cgroup"


def test_meminfo_available_reads_the_kernels_estimate(tmp_path: Path) -> None:
    _write(tmp_path / "meminfo", MEMINFO)
    assert meminfo_available(tmp_path / "meminfo") == 8000000 * 1024
    assert meminfo_available(tmp_path / "missing") is None
    _write(tmp_path / "old", "MemTotal: 1 kB\n")  # kernels before 3.14 have no MemAvailable
    assert meminfo_available(tmp_path / "old") is None


def test_a_v2_limit_leaves_its_headroom_with_the_inactive_page_cache_counted_free(
        tmp_path: Path) -> None:
    # 4 GiB limit, 3 GiB charged of which 1 GiB is page cache the kernel would reclaim.
    root, self_cgroup = _v2_pod(tmp_path, str(4 * GIB), 3 * GIB, GIB)
    assert cgroup_headroom(root, self_cgroup) == 2 * GIB


def test_no_v2_limit_and_no_v1_limit_is_no_headroom_figure(tmp_path: Path) -> None:
    root, self_cgroup = _v2_pod(tmp_path, "max", 3 * GIB, 0)
    _write(root / "memory" / "memory.limit_in_bytes", "9223372036854771712\n")
    _write(root / "memory" / "memory.usage_in_bytes", f"{GIB}\n")
    assert cgroup_headroom(root, self_cgroup) is None


def test_a_v1_limit_counts_too(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    _write(root / "memory" / "memory.limit_in_bytes", f"{6 * GIB}\n")
    _write(root / "memory" / "memory.usage_in_bytes", f"{5 * GIB}\n")
    _write(root / "memory" / "memory.stat", f"cache 7\ntotal_inactive_file {GIB}\n")
    _write(tmp_path / "self_cgroup", "4:memory:/x\n")
    assert cgroup_headroom(root, tmp_path / "self_cgroup") == 2 * GIB


def test_the_tighter_of_meminfo_and_the_cgroup_wins(tmp_path: Path) -> None:
    _write(tmp_path / "meminfo", MEMINFO)  # about 7.6 GiB available on the host
    root, self_cgroup = _v2_pod(tmp_path, str(4 * GIB), 3 * GIB, 0)
    assert host_available_bytes(tmp_path / "meminfo", root, self_cgroup) == GIB
    root, self_cgroup = _v2_pod(tmp_path, "max", 0, 0)
    assert host_available_bytes(tmp_path / "meminfo", root, self_cgroup) == 8000000 * 1024
    assert host_available_bytes(tmp_path / "none", root, self_cgroup) is None


def test_a_cpu_kv_cache_past_the_hosts_memory_is_refused_before_any_allocation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*args: object, **kwargs: object) -> torch.Tensor:
        raise AssertionError("allocated a KV cache the host cannot hold")

    spec = FullAttentionSpec(16, 2, 16)  # 4,096 bytes a block and layer
    monkeypatch.setattr(kv_cache, "host_available_bytes", lambda: 10 * 4096)
    monkeypatch.setattr(torch, "zeros", never)
    with pytest.raises(KVCacheAllocationError, match=r"does not fit on cpu: 2 layers x 6 "
                       r"blocks .* GiB available .*--num-blocks.*max_model_len"):
        allocate_kv_cache(2, 6, spec, torch.device("cpu"))


def test_a_cpu_kv_cache_that_fits_is_allocated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kv_cache, "host_available_bytes", lambda: 12 * 4096)
    caches, config = allocate_kv_cache(2, 6, FullAttentionSpec(16, 2, 16), torch.device("cpu"))
    assert len(caches) == 2 and config.num_blocks == 6
    monkeypatch.setattr(kv_cache, "host_available_bytes", lambda: None)  # nothing to read
    assert len(allocate_kv_cache(2, 6, FullAttentionSpec(16, 2, 16), torch.device("cpu"))[0]) == 2


def _warmup_only(*flags: str, **env_extra: str) -> subprocess.CompletedProcess[str]:
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMGATE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(root / "client"), str(root / "server")])
    return subprocess.run([sys.executable, "-m", "warmgate.server.main", "--model", "tiny",
                           "--device", "cpu", *flags, "--warmup-only"],
                          env={**env, **env_extra}, capture_output=True, text=True, timeout=120,
                          check=False)


def test_warmup_only_refuses_a_cache_the_host_cannot_hold_before_the_load() -> None:
    """763 GiB of KV cache for tiny: refused at start-up (the configuration can never serve),
    one line naming --num-blocks, before any load; allocate_kv_cache's own check (above)
    remains for memory that shrank between start-up and the load."""
    proc = _warmup_only("--num-blocks", "100000000")
    assert proc.returncode == 2, proc.stderr
    assert "argument --num-blocks" in proc.stderr and "host memory" in proc.stderr
    assert "Traceback" not in proc.stderr and "phase=load" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0, proc.stderr


def test_warmup_only_names_the_device_and_backend_of_a_failed_load() -> None:
    """A load that fails (an injected out-of-memory): the outcome line names the device and
    backend (they were left blank), and the phase line the settings to lower, without a
    traceback beside it."""
    proc = _warmup_only(WARMGATE_FAULT_INJECT="load:oom")
    assert proc.returncode == 1, proc.stderr
    load = next(line for line in proc.stdout.splitlines() if line.startswith("load "))
    assert "FAILED" in load and "lower --num-blocks" in load, proc.stdout
    assert "(model tiny, cpu, torch attention, config " in proc.stdout.splitlines()[-1]
    assert "Traceback" not in proc.stderr
