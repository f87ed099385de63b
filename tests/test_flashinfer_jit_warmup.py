"""FlashInfer's jit_warmup on a fake flashinfer module, on the CPU: both modules are built,
on two threads (each with its own workspace) or one after the other, and timed."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, ClassVar

import pytest
import torch

from warmgate.server.runner.attention import flashinfer_backend as fb
from warmgate.server.runner.attention.base import AttentionSpec


class _FakeWrapper:
    calls: ClassVar[list[tuple[str, str, int]]] = []
    lock = threading.Lock()

    def __init__(self, kind: str, workspace: torch.Tensor, *_a: Any, **_k: Any) -> None:
        self.kind, self.workspace = kind, workspace

    def plan(self, *_a: Any, **_k: Any) -> None:
        time.sleep(0.2)  # "nvcc"
        with self.lock:
            self.calls.append((self.kind, threading.current_thread().name,
                               self.workspace.data_ptr()))

    def run(self, q: torch.Tensor, kv: Any) -> torch.Tensor:
        return q


class _FakeFlashInfer:
    def BatchDecodeWithPagedKVCacheWrapper(self, ws: torch.Tensor, *a: Any, **k: Any) -> Any:
        return _FakeWrapper("decode", ws)

    def BatchPrefillWithPagedKVCacheWrapper(self, ws: torch.Tensor, *a: Any, **k: Any) -> Any:
        return _FakeWrapper("prefill", ws)


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> fb.FlashInferAttentionBackend:
    monkeypatch.setattr(fb, "WORKSPACE_BYTES", 1024)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *_a: None)
    monkeypatch.setattr(torch.cuda, "device", lambda _d: contextlib.nullcontext())
    b = fb.FlashInferAttentionBackend.__new__(fb.FlashInferAttentionBackend)
    b.spec = AttentionSpec(num_heads=4, num_kv_heads=2, head_dim=16, block_size=16,
                           num_blocks=4, max_blocks_per_req=2, max_num_reqs=2,
                           max_num_tokens=16, dtype=torch.float32, device=torch.device("cpu"))
    b._fi = _FakeFlashInfer()
    b.workspace = torch.empty(1024, dtype=torch.uint8)
    b.use_tensor_cores = False
    _FakeWrapper.calls = []
    return b


def test_parallel_builds_both_modules_at_once_on_separate_workspaces(
        backend: fb.FlashInferAttentionBackend) -> None:
    info = backend.jit_warmup(parallel=True)
    kinds = {c[0]: c for c in _FakeWrapper.calls}
    assert set(kinds) == {"decode", "prefill"}
    assert kinds["decode"][1] != kinds["prefill"][1]  # two threads
    assert kinds["decode"][2] != kinds["prefill"][2]  # two workspaces
    assert info["parallel"] is True
    assert info["wall_s"] < info["decode_s"] + info["prefill_s"]
    assert info["longest_module_s"] == max(info["decode_s"], info["prefill_s"])


def test_sequential_fallback_by_env(backend: fb.FlashInferAttentionBackend,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fb.PARALLEL_JIT_ENV, "0")
    info = backend.jit_warmup()
    assert info["parallel"] is False
    assert [c[0] for c in _FakeWrapper.calls] == ["decode", "prefill"]
    assert {c[2] for c in _FakeWrapper.calls} == {backend.workspace.data_ptr()}
    assert info["wall_s"] >= info["decode_s"] + info["prefill_s"] - 1e-3
