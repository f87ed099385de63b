"""Each observer against the hook it installs: Triton's knobs (called as Triton calls them),
dynamo's compile callbacks (a real torch.compile), FlashInfer's JIT loader (a stand-in
package, since flashinfer is not installed here)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from warmgate.server.jit import BatchShape, JitMonitor
from warmgate.server.jit.dynamo_observer import DynamoObserver
from warmgate.server.jit.events import DYNAMO, FLASHINFER, TRITON
from warmgate.server.jit.flashinfer_observer import FlashInferObserver


def test_triton_tells_a_compile_from_a_cache_load(tmp_path: Path) -> None:
    knobs = pytest.importorskip("triton").knobs
    from warmgate.server.jit.triton_observer import TritonObserver

    calls: list[str] = []
    knobs.runtime.jit_cache_hook = lambda **kw: calls.append("prev cache") or None
    knobs.runtime.jit_post_compile_hook = lambda **kw: calls.append("prev post")
    try:
        monitor = JitMonitor()
        observer = TritonObserver(cache_dir=str(tmp_path))
        assert observer.install(monitor)
        hook_args: dict[str, Any] = dict(key="k", repr="r", fn=SimpleNamespace(name="_kernel"),
                                         compile={}, is_manual_warmup=False,
                                         already_compiled=False)
        # A compile writes a new entry into the cache directory between the two hooks ...
        assert knobs.runtime.jit_cache_hook(**hook_args) is None  # None: Triton compiles
        (tmp_path / "HASH1").mkdir()
        knobs.runtime.jit_post_compile_hook(**hook_args)
        # ... a load from the cache writes nothing.
        knobs.runtime.jit_cache_hook(**hook_args)
        knobs.runtime.jit_post_compile_hook(**hook_args)
        counts = monitor.snapshot()
        assert counts.compiles == {TRITON: 1} and counts.cache_hits == {TRITON: 1}
        assert calls == ["prev cache", "prev post"] * 2  # the hooks found there still run
        observer.uninstall()
        assert knobs.runtime.jit_cache_hook(**hook_args) is None and calls[-1] == "prev cache"
    finally:
        knobs.runtime.jit_cache_hook = knobs.runtime.jit_post_compile_hook = None


def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1


def test_dynamo_counts_compiles_and_recompiles_with_the_batch() -> None:
    monitor = JitMonitor()
    assert monitor.install([DynamoObserver()]) == [DYNAMO]
    try:
        fn = torch.compile(_double, dynamic=False, backend="eager")
        monitor.current_batch = BatchShape("prefill", 1, 3, 3)
        fn(torch.ones(3))
        fn(torch.ones(3))  # cached: no compile
        monitor.mark_ready()
        monitor.current_batch = BatchShape("uniform_decode", 5, 5, 1)
        events: list[Any] = []
        monitor.add_listener(events.append)
        fn(torch.ones(5))  # a new shape under dynamic=False: a recompile, after ready
        counts = monitor.snapshot()
        assert counts.compiles == {DYNAMO: 2} and counts.after_ready == {DYNAMO: 1}
        (event,) = events
        assert "(recompile)" in event.name and event.batch.num_tokens == 5
        # torch._dynamo.reset() drops every callback; readiness re-arms the observer.
        torch._dynamo.reset()
        monitor.mark_ready()
        torch.compile(_double, dynamic=False, backend="eager")(torch.ones(2))
        assert monitor.snapshot().compiles == {DYNAMO: 3}
    finally:
        monitor.close()
    torch.compile(_double, dynamic=False, backend="eager")(torch.ones(7))
    assert monitor.snapshot().compiles == {DYNAMO: 3}  # uninstalled: no longer counted


def test_flashinfer_absent_installs_nothing() -> None:
    assert "flashinfer" not in sys.modules
    assert not FlashInferObserver().install(JitMonitor())


FAKE_CORE = '''
from pathlib import Path

JIT_DIR = Path(__file__).parent / "jit_cache"


class JitSpec:
    def __init__(self, name):
        self.name = name
        self.is_aot = False

    @property
    def jit_library_path(self):
        return JIT_DIR / self.name / f"{self.name}.so"

    def build_and_load(self):
        path = self.jit_library_path
        if not path.exists():  # ninja builds only what is missing
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"module")
        return "loaded " + self.name
'''


def test_flashinfer_counts_builds_and_cache_loads(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "flashinfer"
    (package / "jit").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "jit" / "__init__.py").write_text("")
    (package / "jit" / "core.py").write_text(textwrap.dedent(FAKE_CORE))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        monitor = JitMonitor()
        observer = FlashInferObserver()
        assert observer.install(monitor)
        from flashinfer.jit.core import JitSpec

        assert JitSpec("decode").build_and_load() == "loaded decode"  # built
        assert JitSpec("decode").build_and_load() == "loaded decode"  # from the JIT cache
        counts = monitor.snapshot()
        assert counts.compiles == {FLASHINFER: 1} and counts.cache_hits == {FLASHINFER: 1}
        observer.uninstall()
        JitSpec("prefill").build_and_load()
        assert monitor.snapshot().compiles == {FLASHINFER: 1}
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == "flashinfer"]:
            del sys.modules[name]
