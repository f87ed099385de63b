"""The garbage collector never runs inside a CUDA-graph capture: freeing an unreachable graph
or stream there is an API call the capture forbids, and it invalidates the capture (on the
H200 a test's capture failed that way after earlier tests left runners behind). Checked on the
CPU with a stand-in graph, since the rule is ours, not CUDA's."""

from __future__ import annotations

import contextlib
import gc
from typing import Any

import pytest
import torch

from warmgate.server.runner import cuda_graphs


class _RecordingGraph:
    def __init__(self) -> None:
        self.gc_enabled_during: list[bool] = []
        self.error_modes: list[str] = []

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        self.gc_enabled_during.append(gc.isenabled())
        self.error_modes.append(capture_error_mode)

    def capture_end(self) -> None:
        self.gc_enabled_during.append(gc.isenabled())


@pytest.fixture(autouse=True)
def _no_cuda_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())


def test_the_collector_is_off_for_the_whole_capture_and_back_on_after() -> None:
    assert gc.isenabled()
    graph = _RecordingGraph()
    with cuda_graphs.capturing(graph, None, None):  # type: ignore[arg-type]
        assert not gc.isenabled()
    assert graph.gc_enabled_during == [False, False]
    assert gc.isenabled()


def test_a_failed_capture_turns_the_collector_back_on() -> None:
    with pytest.raises(RuntimeError), \
            cuda_graphs.capturing(_RecordingGraph(), None, None):  # type: ignore[arg-type]
        raise RuntimeError("kernel launch failed")
    assert gc.isenabled()


def test_a_collector_the_caller_turned_off_stays_off() -> None:
    gc.disable()
    try:
        with cuda_graphs.capturing(_RecordingGraph(), None, None):  # type: ignore[arg-type]
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_capture_mode_is_the_callers() -> None:
    """Global by default (a capture with the process to itself); the MoE autotune's graphs
    ask for thread_local, since the GEMM sweep's thread may be running beside them."""
    graph = _RecordingGraph()
    with cuda_graphs.capturing(graph, None, None):  # type: ignore[arg-type]
        pass
    with cuda_graphs.capturing(graph, None, None,  # type: ignore[arg-type]
                               error_mode="thread_local"):
        pass
    assert graph.error_modes == ["global", "thread_local"]
