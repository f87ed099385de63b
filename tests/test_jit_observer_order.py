"""An observer that imports the attention backend's library (FlashInfer's) is installed after
the weights' load and before the backend is built: the weights need not wait for that import
(which runs on a thread of its own beside them), and nothing of the library runs unseen."""

from __future__ import annotations

from typing import Any

import pytest

from tests.runner_helpers import tiny_config
from warmgate.server.jit import JitMonitor
from warmgate.server.runner import model_runner
from warmgate.server.warmup.plan import load_runner


class _Recorder:
    def __init__(self, name: str, after_weights: bool, events: list[str]) -> None:
        self.name, self.after_weights, self._events = name, after_weights, events

    def install(self, monitor: JitMonitor) -> bool:
        self._events.append(f"install {self.name}")
        return True

    def uninstall(self) -> None:
        self._events.append(f"uninstall {self.name}")

    def rearm(self) -> None:
        """Nothing to re-register."""


def _record_build_steps(monkeypatch: pytest.MonkeyPatch, events: list[str]) -> None:
    def wrap(name: str, label: str) -> None:
        original = getattr(model_runner, name)

        def recorded(*args: Any, **kwargs: Any) -> Any:
            events.append(label)
            return original(*args, **kwargs)

        monkeypatch.setattr(model_runner, name, recorded)

    wrap("load_model", "weights")
    wrap("create_backend", "backend")


def test_install_holds_the_after_weights_observers_until_install_pending() -> None:
    events: list[str] = []
    monitor = JitMonitor()
    now, later = _Recorder("now", False, events), _Recorder("later", True, events)
    assert monitor.install([now, later]) == ["now"]
    assert events == ["install now"] and monitor.observers == ["now"]
    assert monitor.install_pending() == ["later"]
    assert monitor.observers == ["now", "later"]
    assert monitor.install_pending() == []  # once only
    assert events == ["install now", "install later"]
    monitor.close()
    assert events[2:] == ["uninstall later", "uninstall now"]


def test_the_runner_installs_them_between_the_weights_and_the_backend(
        monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    _record_build_steps(monkeypatch, events)
    monitor = JitMonitor()
    monitor.install([_Recorder("early", False, events), _Recorder("library", True, events)])
    model_runner.ModelRunner(tiny_config(), jit_monitor=monitor)
    assert events == ["install early", "weights", "install library", "backend"]
    assert monitor.observers == ["early", "library"]


def test_the_load_phase_names_every_observer_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    held = _Recorder("library", True, events)
    monkeypatch.setattr("warmgate.server.jit.install.observers_for", lambda config: [held])
    monitor = JitMonitor()
    _, phase = load_runner(tiny_config(), jit_monitor=monitor)
    assert phase.shapes["jit_observers"] == ["library"]
    assert events == ["install library"]
    monitor.close()
