"""Programmatic dependent launch's plumbing (kernels/pdl.py), on the CPU: with the switch on,
every converted launch site passes launch_pdl=True and USE_PDL=True together to each kernel it
launches; with it off, or on a CPU tensor (the Triton interpreter, which cannot run the PTX),
it passes USE_PDL=False and no launch_pdl. A recording stand-in replaces the kernels: what is
checked is what the sites hand to Triton's launcher. The runner sets the switch from
--pdl when it is built, and says so in one log line."""

from __future__ import annotations

import dataclasses
import importlib
import logging
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("triton")

from tests.pdl_sites import CONVERTED, SITES
from tests.runner_helpers import tiny_config
from warmgate.server.kernels import pdl
from warmgate.server.runner.default_ops import configure_pdl

Launch = tuple[str, dict[str, Any]]


class _Recorder:
    """Stands in for a @triton.jit kernel: `kernel[grid](*args, **kwargs)` records kwargs."""

    def __init__(self, name: str, launches: list[Launch]) -> None:
        self.name, self.launches = name, launches

    def __getitem__(self, grid: object) -> Any:
        return lambda *args, **kwargs: self.launches.append((self.name, kwargs))


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Launch]]:
    recorded: list[Launch] = []
    for module, name in CONVERTED:
        monkeypatch.setattr(importlib.import_module(module), name, _Recorder(name, recorded))
    yield recorded
    pdl.set_pdl(False)


def _run_every_site(launches: list[Launch]) -> dict[str, list[dict[str, Any]]]:
    for site in SITES.values():
        site()
    by_kernel: dict[str, list[dict[str, Any]]] = {}
    for name, kwargs in launches:
        by_kernel.setdefault(name, []).append(kwargs)
    # Every converted kernel is reached by some site, or the check below covers less.
    assert set(by_kernel) == {name for _, name in CONVERTED}
    return by_kernel


def test_switched_on_every_site_launches_with_pdl_and_its_wait(
        launches: list[Launch], monkeypatch: pytest.MonkeyPatch) -> None:
    pdl.set_pdl(True)
    monkeypatch.setattr(pdl, "runs_compiled", lambda t: True)  # as a CUDA tensor would
    for name, calls in _run_every_site(launches).items():
        for kwargs in calls:
            assert kwargs.get("launch_pdl") is True and kwargs.get("USE_PDL") is True, name


def test_switched_off_no_site_asks_for_pdl(launches: list[Launch],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    pdl.set_pdl(False)
    monkeypatch.setattr(pdl, "runs_compiled", lambda t: True)
    for name, calls in _run_every_site(launches).items():
        for kwargs in calls:
            assert "launch_pdl" not in kwargs and kwargs.get("USE_PDL") is False, name


def test_the_interpreter_never_gets_pdl_even_switched_on(launches: list[Launch]) -> None:
    pdl.set_pdl(True)  # the tensors are CPU tensors: the interpreter runs these kernels
    for name, calls in _run_every_site(launches).items():
        for kwargs in calls:
            assert "launch_pdl" not in kwargs and kwargs.get("USE_PDL") is False, name


def test_the_runner_sets_the_switch_from_its_config(caplog: pytest.LogCaptureFixture) -> None:
    config = tiny_config()
    on = dataclasses.replace(config, compilation=dataclasses.replace(config.compilation,
                                                                      pdl=True))
    try:
        with caplog.at_level(logging.INFO, logger="warmgate.server.runner.default_ops"):
            configure_pdl(on)
        assert pdl.pdl_enabled()
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("pdl:")]
        assert len(lines) == 1 and "rms_norm" in lines[0] and "moe_gemv" in lines[0], lines
        configure_pdl(config)
        assert not pdl.pdl_enabled()
    finally:
        pdl.set_pdl(False)
