"""The server's torch intra-op thread count: one core left to the event loop on a CPU
device, torch's default on CUDA, an explicit --cpu-threads always wins."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch

from warmgate.server import cpu_threads
from warmgate.server.cpu_threads import (
    apply_cpu_threads,
    cgroup_cpu_limit,
    intra_op_threads,
    usable_cpus,
)
from warmgate.server.startup import load_server_config


@pytest.mark.parametrize(("requested", "device", "usable", "expected"), [
    (0, "cpu", 2, 1), (0, "cpu", 16, 15), (0, "cpu", 1, 1),  # never zero threads
    (0, "cuda", 16, None), (0, "cuda:1", 16, None),
    (3, "cpu", 16, 3), (4, "cuda", 16, 4)])
def test_thread_count_policy(requested: int, device: str, usable: int,
                             expected: int | None) -> None:
    assert intra_op_threads(requested, device, usable) == expected


def test_apply_sets_torchs_threads_and_logs_the_decision(
        caplog: pytest.LogCaptureFixture) -> None:
    before = torch.get_num_threads()
    try:
        with caplog.at_level(logging.INFO, logger="warmgate.server.cpu_threads"):
            assert apply_cpu_threads(0, "cpu") == max(1, usable_cpus() - 1)
        assert torch.get_num_threads() == max(1, usable_cpus() - 1)
        assert "--cpu-threads auto" in caplog.text
        assert apply_cpu_threads(0, "cuda") is None  # left alone
        assert torch.get_num_threads() == max(1, usable_cpus() - 1)
    finally:
        torch.set_num_threads(before)


def test_flag_and_environment_reach_the_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert load_server_config(["--device", "cpu"], environ={}).cpu_threads == 0
    assert load_server_config(["--device", "cpu", "--cpu-threads", "3"],
                              environ={}).cpu_threads == 3
    assert load_server_config(["--device", "cpu"],
                              environ={"WARMGATE_CPU_THREADS": "2"}).cpu_threads == 2
    with pytest.raises(SystemExit):
        load_server_config(["--cpu-threads", "-1"], environ={})
    assert "argument --cpu-threads" in capsys.readouterr().err


def _cgroup(tmp_path: Path, cpu_max: dict[str, str], path: str = "/kubepods/pod1/c1") -> Path:
    root = tmp_path / "cgroup"
    for rel, text in cpu_max.items():
        (root / rel).mkdir(parents=True, exist_ok=True)
        (root / rel / "cpu.max").write_text(text)
    (tmp_path / "self_cgroup").write_text(f"0::{path}\n")
    return root


@pytest.mark.parametrize(("cpu_max", "expected"), [
    ({"kubepods/pod1/c1": "200000 100000\n"}, 2),        # a 2-CPU limit on its own cgroup
    ({"kubepods/pod1/c1": "150000 100000\n"}, 2),        # 1.5 CPUs round up
    ({"kubepods/pod1/c1": "max 100000\n", "kubepods/pod1": "300000 100000\n"}, 3),  # parent's
    ({"kubepods/pod1/c1": "800000 100000\n", "kubepods": "400000 100000\n"}, 4),  # tightest
    ({"kubepods/pod1/c1": "50000 100000\n"}, 1),          # never below one
    ({"kubepods/pod1/c1": "max 100000\n"}, None),         # no quota
    ({}, None),                                           # no cgroup v2 files
])
def test_cgroup_cpu_quota(tmp_path: Path, cpu_max: dict[str, str], expected: int | None) -> None:
    root = _cgroup(tmp_path, cpu_max)
    assert cgroup_cpu_limit(root, tmp_path / "self_cgroup") == expected


def test_usable_cpus_is_capped_by_the_quota(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(64)))
    monkeypatch.setattr(cpu_threads, "cgroup_cpu_limit", lambda: 2)
    assert usable_cpus() == 2
    assert intra_op_threads(0, "cpu", usable_cpus()) == 1
    monkeypatch.setattr(cpu_threads, "cgroup_cpu_limit", lambda: None)
    assert usable_cpus() == 64
