"""The attention backend's library is imported on a thread of its own once the compile cache
has set its environment, beside the weights' load (control/background_startup.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.grpc_harness import server_config
from warmgate.server.control import engine as engine_module
from warmgate.server.control.background_startup import import_in_background
from warmgate.server.core.results import PhaseStatus


def test_a_module_not_yet_imported_is_imported_on_its_own_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "warmgate_slow_library.py").write_text(
        "import threading\nIMPORTED_ON = threading.current_thread().name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "warmgate_slow_library", raising=False)
    thread = import_in_background("warmgate_slow_library")
    assert thread is not None
    thread.join(30)
    module = sys.modules["warmgate_slow_library"]
    assert module.IMPORTED_ON == thread.name != "MainThread"


def test_nothing_starts_for_an_imported_or_missing_module() -> None:
    assert import_in_background("json") is None
    assert import_in_background("warmgate_no_such_library") is None


def test_a_failing_import_is_left_to_the_backend(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "warmgate_broken_library.py").write_text("raise ImportError('no GPU here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    thread = import_in_background("warmgate_broken_library")
    assert thread is not None
    thread.join(30)
    assert "warmgate_broken_library" not in sys.modules


def test_the_load_starts_the_backend_library_import_after_the_cache(
        monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[str] = []
    real_open = engine_module.open_compile_cache
    monkeypatch.setattr(engine_module, "open_compile_cache",
                        lambda *a: (order.append("cache"), real_open(*a))[1])
    monkeypatch.setattr(engine_module, "import_in_background",
                        lambda module: order.append(f"import {module}"))
    phase = engine_module.PlanEngine(server_config().runner).load()
    assert phase.status is PhaseStatus.RAN
    assert order == ["cache", "import torch"]  # the CPU's backend; flashinfer on a GPU
