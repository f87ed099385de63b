"""The server's torch intra-op thread count: one core left to the event loop on a CPU
device, torch's default on CUDA, an explicit --cpu-threads always wins."""

from __future__ import annotations

import logging

import pytest
import torch

from warmgate.server.cpu_threads import apply_cpu_threads, intra_op_threads, usable_cpus
from warmgate.server.server_config import load_server_config


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
